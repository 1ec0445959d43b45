package handlers_test

// The database failing under the checkout's Pay click, Check now and a four-eyes approval (an
// outside review, lost commits): a COMMIT the server executed whose answer never reached the
// replica (ackDropper, api_db_lost_ack_test.go).

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// holdLetGo is a core option whose background let-go of a hold (Hooks.AfterHoldLetGo) reports
// on the returned channel.
func holdLetGo() (func(*payments.Config), chan error) {
	done := make(chan error, 8)
	return func(c *payments.Config) {
		c.Hooks.AfterHoldLetGo = func(_ string, err error) {
			select {
			case done <- err:
			default:
			}
		}
	}, done
}

// lostAckReplica is an API bench with a second replica whose connections go through an
// ackDropper, and the channel its background let-go of holds reports on.
func lostAckReplica(t *testing.T) (*apiBench, *ackDropper, *payments.Service, chan error) {
	t.Helper()
	hook, done := holdLetGo()
	b := newAPIBench(t)
	d := &ackDropper{}
	svcB, _ := b.server(t, droppingPool(t, b, d), "replica-b", benchOpt{core: hook})
	return b, d, svcB, done
}

// The Pay click's acquire (its intent row, COMMIT in its own round trip) committed and its
// answer was lost: the customer got the 503 page, and the same click again waited "your payment
// is being prepared" until the hold ran out (30 s by default) though nothing ran for it. The
// click lets go of its key by its token in the background. Negative control (run by hand):
// without it, the same click again is busy.
func TestAClickWhoseAcquireAnswerWasLostIsNotHeld(t *testing.T) {
	t.Parallel()
	b, d, svcB, done := lostAckReplica(t)
	ctx := context.Background()
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "lost-acquire", Amount: 1000, Currency: "EUR"}

	d.arm("INSERT INTO checkout_intents", commandComplete("COMMIT"))
	if _, err := svcB.CheckoutPay(ctx, key, in, 0); d.count() != 1 || payments.ErrorCode(err) != payments.EUNAVAIL {
		t.Fatalf("first click (acquire committed, answer lost): %v (dropped %d)", err, d.count())
	}
	wantLetGo(t, done)
	again, err := b.svc.CheckoutPay(ctx, key, in, 0)
	if err != nil || again.Session.Status != payments.StatusRegistered {
		t.Fatalf("the same click again, nothing running for it: %+v %v (code %s); want the click run", again.Session, err, payments.ErrorCode(err))
	}
}

// The click's payment was registered and the bind of its key committed with its answer lost:
// the click answered the 503 page ("try again") though its payment was registered and the bank's
// page was where it should go. It answers its session; the bind is written in the background
// when it did not commit. Negative control (run by hand): the bind's error answered, 503.
func TestAClickWhoseBindAnswerWasLostGoesToItsPayment(t *testing.T) {
	t.Parallel()
	b, d, svcB, done := lostAckReplica(t)
	ctx := context.Background()
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "lost-bind", Amount: 1000, Currency: "EUR"}

	d.arm("UPDATE checkout_intents SET session_id = $3", commandComplete("COMMIT"))
	res, err := svcB.CheckoutPay(ctx, key, in, 0)
	if d.count() != 1 {
		t.Fatalf("not dropped: %+v %v", res, err)
	}
	if err != nil || res.Session.Status != payments.StatusRegistered {
		t.Fatalf("the click whose payment is registered = %+v %v (code %s); want its session, to the bank", res.Session, err, payments.ErrorCode(err))
	}
	wantLetGo(t, done) // the bind, written again by its token (nothing to write: it had committed)
	if it, err := b.svc.GetCheckoutIntent(ctx, key); err != nil || it.SessionID != res.Session.ID {
		t.Fatalf("the click's key: %+v %v, want it bound to its payment", it, err)
	}
}

// Check now's claims committed with their answer lost: the person saw "try again", and trying
// again every payment was skipped "being checked by" them for the claim's time (two minutes or
// more) while nothing checked it. The claims are ended by the request's token in the
// background. Negative control (run by hand): without it, skipped.
func TestCheckNowAfterALostClaimAnswerChecks(t *testing.T) {
	t.Parallel()
	b, d, svcB, done := lostAckReplica(t)
	ctx := context.Background()
	p := wantPayment(t, b.do(post(createPath("lost-checknow"), `{"amount":1000,"currency":"EUR"}`)), 201)
	fin := payments.Staff{Email: "fin@example.com", Role: string(access.RoleFinance)}

	d.arm("INSERT INTO finance_check_claims", commandComplete("COMMIT"))
	if _, err := svcB.CheckNow(ctx, fin, []string{p.ID}); d.count() != 1 || payments.ErrorCode(err) != payments.EUNAVAIL {
		t.Fatalf("first check now (claim committed, answer lost): %v (dropped %d)", err, d.count())
	}
	wantLetGo(t, done)
	res, err := b.svc.CheckNow(ctx, fin, []string{p.ID})
	if err != nil || len(res) != 1 || !res[0].Checked {
		t.Fatalf("check now again after the lost claim: %+v %v; want the payment checked", res, err)
	}
}

// A refund proposal's approval committed with its answer lost: the approver, sending it again,
// was refused "already approved by" themselves and not told what their approval did. The same
// approver's approval again is answered with it, done once. Negative control (run by hand):
// without ownApproval, 409.
func TestTheApproversApprovalSentAgainIsAnsweredWithIt(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	d := &ackDropper{}
	limit := func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 100} }
	svcA, _ := b.replica(b.pool, "replica-a2", b.gw, limit)
	svcB, _ := b.replica(consoleDroppingPool(t, b, d), "replica-b", b.gw, limit)
	b.user(t, "f1@example.com", access.RoleFinance)
	b.user(t, "f2@example.com", access.RoleFinance)
	f1 := payments.Staff{Email: "f1@example.com", Role: string(access.RoleFinance)}
	f2 := payments.Staff{Email: "f2@example.com", Role: string(access.RoleFinance)}
	s := b.completed(t, "lost-approve", 2000)
	ctx := context.Background()
	res, err := svcA.RefundByFinance(ctx, f1, payments.StaffRefundInput{PaymentID: s.ID, Amount: 500, Reason: "damaged", IntentKey: uuid.NewString()})
	if err != nil || res.Proposal == nil {
		t.Fatalf("setup: %+v %v", res, err)
	}
	d.arm("UPDATE resolution_proposals SET state = 'approved'", commandComplete("COMMIT"))
	if _, err := svcB.ApproveResolution(ctx, f2, res.Proposal.ID); d.count() != 1 || payments.ErrorCode(err) != payments.EUNAVAIL {
		t.Fatalf("approval (committed, answer lost): %v (dropped %d)", err, d.count())
	}
	r, err := svcA.ApproveResolution(ctx, f2, res.Proposal.ID)
	if err != nil || r.State != payments.ResolutionApproved || r.DecidedBy != f2.Email {
		t.Fatalf("the approver's approval sent again: %+v %v; want the approval answered", r, err)
	}
	if n := b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1`, s.ID); n != 1 {
		t.Errorf("%d refunds, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1`, payments.AuditResolutionApprove); n != 1 {
		t.Errorf("%d approval audits, want 1", n)
	}
	// Another person is still told who approved it.
	if _, err := svcA.ApproveResolution(ctx, payments.Staff{Email: "adm@example.com", Role: "admin"}, res.Proposal.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Errorf("another person's approval = %v, want a conflict", err)
	}
}

// consoleDroppingPool is droppingPool for a console bench.
func consoleDroppingPool(t *testing.T, b *consoleBench, d *ackDropper) *pgxpool.Pool {
	t.Helper()
	return droppingPool(t, &apiBench{pool: b.pool}, d)
}

// Support's refund code request whose transaction (the challenge, its queued message) committed
// with its answer lost: the console audited "refused: unavailable" beside what was done — a
// code on its way to the customer. A database that failed under an action is audited as an
// outcome unknown. Negative control (run by hand): "refused". (Finance's direct refund, where
// this was first seen, now reads its claim back and goes on: TestAFinanceRefundWhoseClaimAnswerWasLostIsMade.)
func TestAnActionTheDatabaseFailedIsAuditedAsUnknown(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	d := &ackDropper{}
	_, eB := b.replica(consoleDroppingPool(t, b, d), "replica-b", b.gw)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := newAgent(t, eB)
	sup.login("sup@example.com")
	s := b.completed(t, "lost-code-request", 2000)

	action, form := formValues(page(t, sup.get("/payments/"+s.ID), http.StatusOK), "support-refund-form")
	form.Set("amount", "4.00")
	form.Set("reason", "late delivery")
	d.arm("INSERT INTO cancel_challenges", commandComplete("COMMIT"))
	sup.post(action, form)
	if d.count() != 1 || b.count(t, `SELECT count(*) FROM cancel_challenges WHERE session_id = $1`, s.ID) != 1 {
		t.Fatalf("setup: the code request was not committed with its answer lost (dropped %d)", d.count())
	}
	rows, err := b.pool.Query(context.Background(), `SELECT detail FROM audit_log WHERE action = $1 AND target = $2 ORDER BY id`, payments.AuditRefundRequest, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	details, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	unknown := 0
	for _, r := range details {
		if strings.HasPrefix(r, "refused") {
			t.Errorf("audit entry %q for a code that was sent", r)
		}
		if strings.HasPrefix(r, "outcome unknown") {
			unknown++
		}
	}
	if unknown != 1 {
		t.Errorf("audit entries %q, want one saying the outcome is unknown", details)
	}
}

// Finance's direct refund whose claim (the Pending refund and its "claimed" audit entry)
// committed with its answer lost (a failover): the person saw an error page for a refund that was
// made, which the gateway heard of only from the patrol after its grace, and the form sent again
// said it had been "sent". The claim is read back by its id and the request goes on: the refund
// is asked for now, and the page says so. Negative control (run by hand, claimedAfterAll
// answering err): the error page, no refund sent.
func TestAFinanceRefundWhoseClaimAnswerWasLostIsMade(t *testing.T) {
	t.Parallel()
	b, d, f1, s, res := financeRefundLosingCommit(t, 10000, "lost-fin-refund", "INSERT INTO refunds")
	if d.count() != 1 {
		t.Fatalf("setup: the refund's claim answer was not dropped (%d)", d.count())
	}
	if res.Code != http.StatusSeeOther || b.gw.Calls("refund") != 1 ||
		b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1 AND status = 'Succeeded'`, s.ID) != 1 {
		t.Fatalf("the claimed refund: %d, %d sent to the gateway, %d refunds succeeded; want it made now and the payment's page",
			res.Code, b.gw.Calls("refund"), b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1 AND status = 'Succeeded'`, s.ID))
	}
	if body := f1.get("/payments/" + s.ID).Body.String(); !strings.Contains(body, "Refunded 4.00") {
		t.Errorf("the page after the refund does not say it was refunded")
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2`, payments.AuditRefund, s.ID); n != 1 {
		t.Errorf("%d refund audit entries, want the claim's one", n)
	}
}

// The database ends every idle connection of a replica's pool while a keyed Create waits on the
// gateway (a PostgreSQL restart; pgbouncer's KILL or restart does the same: FATAL, then the end)
// and answers again before the gateway does. The Create's apply found a dead connection in the
// pool (idle under a second: not pinged), failed, and the shop was answered 202 Registering
// without the confirmation_url to send its customer to, until the patrol registered it again
// after RegisterGrace (an outside review, pgbouncer). Such a connection is pinged, found dead and
// replaced (dbconn.ShouldPing). Negative control (run by hand, pgxpool's default ShouldPing):
// 202 without confirmation_url.
func TestACreateWhoseIdleConnectionsTheServerEndedIsAnswered(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	poolB := testdb.Pool(t, b.url)
	_, eB := b.server(t, poolB, "replica-b")
	warm := b.on(eB, post(createPath("warm"), `{"amount":1000,"currency":"EUR"}`, "Idempotency-Key", "k-warm"))
	if warm.Code != http.StatusCreated {
		t.Fatalf("setup: %d %s", warm.Code, warm.Body)
	}
	gate := b.gw.Hold(fakegw.OpRegister)
	req := post(createPath("ended"), `{"amount":1000,"currency":"EUR"}`, "Idempotency-Key", "k-ended")
	first := b.goDo(eB, req)
	mustWait(t, gate.Arrived(), "the registration")
	var idle []int32
	for _, c := range poolB.AcquireAllIdle(context.Background()) {
		idle = append(idle, int32(c.Conn().PgConn().PID()))
		c.Release()
	}
	var ended int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM unnest($1::int[]) pid`, idle).Scan(&ended); err != nil || ended == 0 {
		t.Fatalf("setup: %d idle connections ended (%v)", ended, err)
	}
	gate.Open()
	r1 := mustWait(t, first, "the Create's answer")
	if p := decode[payment](t, r1); r1.Code != http.StatusCreated || p.Status != "Registered" || p.ConfirmationURL == nil {
		t.Fatalf("the Create whose gateway registered its payment with the database answering: %d %s; want 201 with its confirmation_url", r1.Code, r1.Body)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Errorf("%d registrations, want the two Creates'", n)
	}
}

// The same for a refund above the direct limit: its four-eyes proposal (and its audit entry)
// committed with the answer lost is read back (by its id, for this payment and form) and
// answered as the proposal it is, not an error page. Negative control (run by hand, the
// read-back skipped): no "waits for a second" message.
func TestAFinanceProposalWhoseAnswerWasLostIsAnswered(t *testing.T) {
	t.Parallel()
	b, d, f1, s, res := financeRefundLosingCommit(t, 100, "lost-fin-proposal", "INSERT INTO resolution_proposals")
	if d.count() != 1 || b.count(t, `SELECT count(*) FROM resolution_proposals WHERE session_id = $1`, s.ID) != 1 {
		t.Fatalf("setup: the proposal was not committed with its answer lost (dropped %d)", d.count())
	}
	if res.Code != http.StatusSeeOther {
		t.Fatalf("the proposal whose answer was lost: %d, want the payment's page", res.Code)
	}
	if body := f1.get("/payments/" + s.ID).Body.String(); !strings.Contains(body, "is more than you may refund alone") {
		t.Errorf("the page after the proposal does not say it waits for a second person")
	}
	if n := b.gw.Calls("refund"); n != 0 {
		t.Errorf("%d refunds sent for a proposal", n)
	}
}

// financeRefundLosingCommit: a finance user on a replica whose database loses the answer of the
// COMMIT of the transaction that wrote written, sending the refund form of a payment of 20.00
// for 4.00 (directLimit: REFUND_DIRECT_LIMIT in EUR cents).
func financeRefundLosingCommit(t *testing.T, directLimit int64, order, written string) (*consoleBench, *ackDropper, *agent, payments.Session, *httptest.ResponseRecorder) {
	t.Helper()
	b := newConsoleBench(t)
	d := &ackDropper{}
	_, eB := b.replica(consoleDroppingPool(t, b, d), "replica-b", b.gw, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": directLimit} })
	b.user(t, "f1@example.com", access.RoleFinance)
	f1 := newAgent(t, eB)
	f1.login("f1@example.com")
	s := b.completed(t, order, 2000)
	action, form := formValues(page(t, f1.get("/payments/"+s.ID), http.StatusOK), "finance-refund-form")
	form.Set("amount", "4.00")
	form.Set("reason", "late delivery")
	d.arm(written, commandComplete("COMMIT"))
	return b, d, f1, s, f1.post(action, form)
}
