package payments_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/telemetry/telemetrytest"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

var (
	fin1 = payments.Staff{Email: "fin1@example.com", Role: "finance"}
	fin2 = payments.Staff{Email: "fin2@example.com", Role: "finance"}
	adm  = payments.Staff{Email: "adm@example.com", Role: "admin"}
)

// flagged creates a Registered session and flags it as the patrol does when its schedule runs
// out (with the sweep_exhausted case).
func (b *bench) flagged(t *testing.T, orderID string, amount int64) payments.Session {
	t.Helper()
	s := b.registered(t, orderID, amount)
	b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'schedule ran out', next_check_at = NULL WHERE id = $1`, s.ID, b.clock.Now())
	b.exec(t, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at) VALUES ($1, $2, 'sweep_exhausted', 'x', $3)`, s.ID, orderID, b.clock.Now())
	s, err := b.svc.Get(context.Background(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *bench) propose(t *testing.T, by payments.Staff, id string, outcome payments.Status) payments.Resolution {
	t.Helper()
	r, err := b.svc.ProposeResolution(context.Background(), by, payments.ProposalInput{SessionID: id, Outcome: outcome,
		Reason: "the customer's bank shows the charge", Evidence: "gateway dashboard: captured, ticket FIN-7"})
	if err != nil {
		t.Fatalf("propose %s: %v", outcome, err)
	}
	return r
}

// settledByHand is a payment of 10.00 EUR whose registration answer was lost (Unknown, no
// gateway payment id) and which the customer paid at the gateway: finance settled it Completed
// by four eyes, as the gateway's dashboard showed. It returns the session and its payment at the
// gateway, which pitlane has not recorded.
func (b *bench) settledByHand(t *testing.T, order string) (payments.Session, string) {
	t.Helper()
	ctx := context.Background()
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	r0, err := b.plain.Create(ctx, api, payments.CreateInput{OrderID: order, Amount: 1000, Currency: "EUR"})
	if err != nil || r0.Session.Status != payments.StatusUnknown || r0.Session.GatewayPaymentID != "" {
		t.Fatalf("setup: %+v %v", r0.Session, err)
	}
	var gp string
	for i := 1; i < 100 && gp == ""; i++ {
		if p, ok := b.gw.Payment(fmt.Sprintf("gp_fake_%d", i)); ok && p.Reference == r0.Session.ID {
			gp = p.ID
		}
	}
	if gp == "" {
		t.Fatalf("setup: no gateway payment under %s", r0.Session.ID)
	}
	b.gw.SetStatus(gp, payments.GatewaySucceeded)
	p := b.propose(t, fin1, r0.Session.ID, payments.StatusCompleted)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	return r0.Session, gp
}

func wantCode(t *testing.T, err error, code, msg string) {
	t.Helper()
	if payments.ErrorCode(err) != code || !strings.Contains(payments.ErrorMessage(err), msg) {
		t.Fatalf("err = %v, want %s containing %q", err, code, msg)
	}
}

// Propose → the proposer cannot approve → a second person approves → Completed through the one
// transition, the order Paid, exactly one PaymentReceived entry, the session's cases resolved,
// both steps audited. When the gateway later says something else, a case opens and nothing
// changes.
func TestResolutionFourEyesCompleted(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.flagged(t, "o-4eyes", 4200)
	// A second gateway payment under the session's reference: other money, which settling
	// this payment does not answer.
	b.exec(t, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at) VALUES ($1, 'o-4eyes', $2, 'gp_2 too', $3)`,
		s.ID, payments.CaseDuplicatePayment, b.clock.Now())

	p := b.propose(t, fin1, s.ID, payments.StatusCompleted)
	if p.State != payments.ResolutionProposed || p.StatusAtProposal != payments.StatusRegistered || p.Amount != 4200 {
		t.Fatalf("proposal = %+v", p)
	}
	_, err := b.svc.ApproveResolution(ctx, fin1, p.ID)
	wantCode(t, err, payments.EFORBIDDEN, "a second finance or admin user must approve")
	if cur, _ := b.svc.Get(ctx, s.ID); cur.Status != payments.StatusRegistered {
		t.Fatalf("self-approval changed the payment: %s", cur.Status)
	}

	a, err := b.svc.ApproveResolution(ctx, adm, p.ID)
	if err != nil || a.State != payments.ResolutionApproved || a.DecidedBy != adm.Email || a.SessionStatus != payments.StatusCompleted {
		t.Fatalf("approve = %+v, %v", a, err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-4eyes' AND entry_type = 'PaymentReceived' AND amount = 4200`); n != 1 {
		t.Fatalf("PaymentReceived entries = %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM orders WHERE order_id = 'o-4eyes' AND status = 'Paid' AND paid_session_id = $1`, s.ID); n != 1 {
		t.Fatal("order not Paid")
	}
	if n := b.count(t, `SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status = 'Completed'
		AND actor_kind = 'staff' AND actor_id = $2 AND reason LIKE 'four-eyes resolution #%proposed by fin1@example.com%'`, s.ID, adm.Email); n != 1 {
		t.Fatal("no timeline event of the approval")
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL AND kind <> $2`, s.ID, payments.CaseDuplicatePayment); n != 0 {
		t.Fatalf("%d cases the settlement answers still open after the approval", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL AND kind = $2`, s.ID, payments.CaseDuplicatePayment); n != 1 {
		t.Fatal("the approval closed the duplicate payment's case: the second payment's money is off finance's list")
	}
	var closed int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1 AND kind = $2`, s.ID, payments.CaseSweepExhausted).Scan(&closed); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2 AND detail LIKE $3`,
		payments.AuditResolutionApprove, s.ID, fmt.Sprintf("%%closed case #%d", closed)); n != 1 {
		t.Fatal("the approval's audit entry does not name the case it closed")
	}
	for action, who := range map[string]string{payments.AuditResolutionPropose: fin1.Email, payments.AuditResolutionApprove: adm.Email} {
		if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND actor = $2 AND target = $3`, action, who, s.ID); n != 1 {
			t.Errorf("%s audited %d times", action, n)
		}
	}
	_, err = b.svc.ApproveResolution(ctx, fin2, p.ID)
	wantCode(t, err, payments.ECONFLICT, "already approved by adm@example.com")

	// The gateway disagrees later (a webhook, reconciliation, a Check): a case, no change.
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayDeclined)
	after, err := b.svc.Check(ctx, api, s.ID)
	if err != nil || after.Status != payments.StatusCompleted {
		t.Fatalf("check after approval: %s %v", after.Status, err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL`, s.ID); n != 1 {
		t.Fatalf("open gateway_mismatch cases = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-4eyes'`); n != 1 {
		t.Fatalf("ledger entries after the contradiction = %d", n)
	}
}

// Every settled outcome, contradicted later by the gateway, opens the case decide() names and
// changes no status or money.
func TestResolutionGatewayLaterSaysOtherwise(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		outcome payments.Status
		setup   func(b *bench, t *testing.T) payments.Session
		gateway func(b *bench, s payments.Session)
		kind    string
	}{
		{"failed, then paid", payments.StatusFailed,
			func(b *bench, t *testing.T) payments.Session { return b.flagged(t, "o-late", 100) },
			func(b *bench, s payments.Session) { b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded) },
			payments.CaseLatePayment},
		{"completed, gateway still pending", payments.StatusCompleted,
			func(b *bench, t *testing.T) payments.Session { return b.flagged(t, "o-pending", 100) },
			func(*bench, payments.Session) {}, // the fake's payment stays pending
			payments.CaseGatewayMismatch},
		{"completed without a gateway payment", payments.StatusCompleted,
			func(b *bench, t *testing.T) payments.Session {
				b.gw.Fail(fakegw.OpRegister, fakegw.Transient, 1) // Unknown; the gateway has nothing
				r, err := b.plain.Create(ctx, api, payments.CreateInput{OrderID: "o-nogw", Amount: 100, Currency: "EUR"})
				if err != nil || r.Session.Status != payments.StatusUnknown {
					t.Fatalf("setup: %+v %v", r.Session, err)
				}
				return r.Session
			},
			func(*bench, payments.Session) {},
			payments.CaseGatewayMismatch},
		{"canceled, then paid", payments.StatusCanceled,
			func(b *bench, t *testing.T) payments.Session {
				s := b.registered(t, "o-cancel-stuck", 100)
				ch, err := b.plain.RequestCancel(ctx, api, s.ID)
				if err != nil {
					t.Fatal(err)
				}
				b.gw.Fail(fakegw.OpReverse, fakegw.Transient, 1)
				if res, err := b.plain.ConfirmCancel(ctx, api, s.ID, ch.ID, b.lastCode(t, s.ID)); err != nil || res.Session.Status != payments.StatusCanceling {
					t.Fatalf("setup: %+v %v", res.Session, err)
				}
				b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'reverse never confirmed' WHERE id = $1`, s.ID, b.clock.Now())
				return s
			},
			func(b *bench, s payments.Session) { b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded) },
			payments.CaseLatePayment},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			s := c.setup(b, t)
			p := b.propose(t, fin1, s.ID, c.outcome)
			if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
				t.Fatal(err)
			}
			entries := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, s.ID)
			c.gateway(b, s)
			after, err := b.svc.Check(ctx, api, s.ID)
			if err != nil || after.Status != c.outcome {
				t.Fatalf("check after approval: %s %v", after.Status, err)
			}
			if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL`, s.ID, c.kind); n != 1 {
				t.Fatalf("open %s cases = %d, want 1", c.kind, n)
			}
			if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, s.ID); n != entries {
				t.Fatalf("ledger entries %d → %d", entries, n)
			}
			if c.outcome == payments.StatusCanceled {
				if n := b.count(t, `SELECT count(*) FROM reverse_operations WHERE session_id = $1 AND status = 'Succeeded' AND detail LIKE 'confirmed by people%'`, s.ID); n != 1 {
					t.Fatal("the reverse was not marked confirmed")
				}
			}
		})
	}
}

// What may be proposed, and what is refused with a readable reason.
func TestResolutionRefusals(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	in := func(id string, o payments.Status) payments.ProposalInput {
		return payments.ProposalInput{SessionID: id, Outcome: o, Reason: "r", Evidence: "e"}
	}

	fresh := b.registered(t, "o-fresh", 100)
	_, err := b.svc.ProposeResolution(ctx, fin1, in(fresh.ID, payments.StatusFailed))
	wantCode(t, err, payments.ECONFLICT, "only flagged, Unknown or mismatched payments are settled by hand")
	// An open gateway_mismatch case makes it settleable.
	b.exec(t, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at) VALUES ($1, 'o-fresh', 'gateway_mismatch', 'x', $2)`, fresh.ID, b.clock.Now())
	_, err = b.svc.ProposeResolution(ctx, fin1, in(fresh.ID, payments.StatusCanceled))
	wantCode(t, err, payments.ECONFLICT, "only a Canceling payment")
	for _, bad := range []payments.ProposalInput{
		{SessionID: fresh.ID, Outcome: payments.StatusAuthorized, Reason: "r", Evidence: "e"},
		{SessionID: fresh.ID, Outcome: payments.StatusFailed, Reason: "  ", Evidence: "e"},
		{SessionID: fresh.ID, Outcome: payments.StatusFailed, Reason: "r", Evidence: ""},
		{SessionID: fresh.ID, Outcome: payments.StatusFailed, Reason: strings.Repeat("x", payments.MaxReasonLength+1), Evidence: "e"},
	} {
		if _, err := b.svc.ProposeResolution(ctx, fin1, bad); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("%+v: %v, want invalid", bad, err)
		}
	}
	p := b.propose(t, fin1, fresh.ID, payments.StatusFailed)
	_, err = b.svc.ProposeResolution(ctx, fin2, in(fresh.ID, payments.StatusCompleted))
	wantCode(t, err, payments.ECONFLICT, "already waits for approval")

	// Reject needs a note; the proposer may withdraw their own; a decided proposal stays decided.
	_, err = b.svc.RejectResolution(ctx, fin2, p.ID, " ")
	wantCode(t, err, payments.EINVALID, "say why")
	r, err := b.svc.RejectResolution(ctx, fin1, p.ID, "wrong session, withdrawn")
	if err != nil || r.State != payments.ResolutionRejected || r.DecisionNote != "wrong session, withdrawn" {
		t.Fatalf("reject = %+v %v", r, err)
	}
	_, err = b.svc.ApproveResolution(ctx, fin2, p.ID)
	wantCode(t, err, payments.ECONFLICT, "already rejected by fin1@example.com")
	_, err = b.svc.RejectResolution(ctx, fin2, p.ID, "again")
	wantCode(t, err, payments.ECONFLICT, "already rejected")
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2`, payments.AuditResolutionReject, fresh.ID); n != 1 {
		t.Fatalf("rejections audited %d times", n)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, 999999); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("unknown proposal: %v", err)
	}

	// Stale evidence: proposed while Unknown, the gateway then found the registration; the
	// approval is refused and changes nothing.
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	r0, err := b.plain.Create(ctx, api, payments.CreateInput{OrderID: "o-stale", Amount: 100, Currency: "EUR"})
	if err != nil || r0.Session.Status != payments.StatusUnknown {
		t.Fatalf("setup: %+v %v", r0.Session, err)
	}
	stale := b.propose(t, fin1, r0.Session.ID, payments.StatusFailed)
	if s, err := b.plain.Check(ctx, api, r0.Session.ID); err != nil || s.Status != payments.StatusRegistered {
		t.Fatalf("check: %s %v", s.Status, err)
	}
	_, err = b.svc.ApproveResolution(ctx, fin2, stale.ID)
	wantCode(t, err, payments.ECONFLICT, "moved from Unknown to Registered since the proposal")
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state = 'proposed'`, stale.ID); n != 1 {
		t.Fatal("a refused approval changed the proposal")
	}

	// A settled payment has nothing to settle.
	done := b.registered(t, "o-done", 100)
	b.gw.SetStatus(done.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.plain.Check(ctx, api, done.ID); err != nil {
		t.Fatal(err)
	}
	_, err = b.svc.ProposeResolution(ctx, fin1, in(done.ID, payments.StatusFailed))
	wantCode(t, err, payments.ECONFLICT, "is Completed already")

	// Four eyes is a schema fact too: no path may store an approval by the proposer.
	_, err = b.pool.Exec(ctx, `UPDATE resolution_proposals SET state = 'approved', decided_by = proposed_by, decided_at = now() WHERE id = $1`, stale.ID)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.ConstraintName != "resolution_proposals_four_eyes" {
		t.Fatalf("self-approval by SQL: %v", err)
	}
}

type approveOut struct {
	r   payments.Resolution
	err error
}

func goApprove(svc *payments.Service, by payments.Staff, id int64) <-chan approveOut {
	ch := make(chan approveOut, 1)
	go func() {
		r, err := svc.ApproveResolution(context.Background(), by, id)
		ch <- approveOut{r, err}
	}()
	return ch
}

// Two people approve the same proposal at the same moment: the first holds the order and
// session locks (parked), the second is seen waiting for them, then the first commits. One
// approval, one Completed transition, one PaymentReceived entry; the second is told who
// approved.
func TestResolutionDoubleApprovalAppliesOnce(t *testing.T) {
	t.Parallel()
	locked := newParker()
	b := newBench(t, func(c *payments.Config) { c.Hooks.AfterResolutionLock = locked.hook })
	s := b.flagged(t, "o-double-approve", 990)
	p := b.propose(t, fin1, s.ID, payments.StatusCompleted)
	other := b.service(b.pool, "replica-b")

	first := goApprove(b.svc, adm, p.ID)
	mustWait(t, locked.arrived, "the first approval holds the locks")
	second := goApprove(other, fin2, p.ID)
	waitLockWaiters(t, b.pool, 1)
	locked.let(1)
	r1, r2 := mustWait(t, first, "first approval"), mustWait(t, second, "second approval")
	if r1.err != nil || r1.r.State != payments.ResolutionApproved {
		t.Fatalf("first = %+v %v", r1.r, r1.err)
	}
	wantCode(t, r2.err, payments.ECONFLICT, "already approved by adm@example.com")
	for sql, want := range map[string]int{
		`SELECT count(*) FROM accounting_entries WHERE session_id = $1`:                          1,
		`SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status = 'Completed'`:  1,
		`SELECT count(*) FROM audit_log WHERE target = $1 AND action = 'resolution.approve'`:     1,
		`SELECT count(*) FROM resolution_proposals WHERE session_id = $1 AND state = 'approved'`: 1,
	} {
		if n := b.count(t, sql, s.ID); n != want {
			t.Errorf("%s = %d, want %d", sql, n, want)
		}
	}
}

// naiveApprove is an approval without locks or guards: read the proposal, then write. The
// negative control.
func naiveApprove(ctx context.Context, pool *pgxpool.Pool, by payments.Staff, id int64, afterRead func(context.Context, string)) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var state, sessionID, outcome string
	if err := tx.QueryRow(ctx, `SELECT state, session_id::text, outcome FROM resolution_proposals WHERE id = $1`, id).
		Scan(&state, &sessionID, &outcome); err != nil {
		return err
	}
	afterRead(ctx, sessionID)
	if state != payments.ResolutionProposed {
		return nil
	}
	for _, st := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE resolution_proposals SET state = 'approved', decided_by = $2, decided_at = now() WHERE id = $1`, []any{id, by.Email}},
		{`UPDATE payment_sessions SET status = $2 WHERE id = $1`, []any{sessionID, outcome}},
		{`INSERT INTO session_events (session_id, from_status, to_status, actor_kind, actor_id, created_at)
			VALUES ($1, 'Registered', $2, 'staff', $3, now())`, []any{sessionID, outcome, by.Email}},
		{`INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, created_at)
			SELECT order_id, id, 'PaymentReceived', amount, currency, now() FROM payment_sessions WHERE id = $1`, []any{sessionID}},
	} {
		if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// The negative control: two naive approvals that both read "proposed" before either writes
// apply the outcome twice (two Completed events, two PaymentReceived entries once the last line
// of defence, the unique index, is out of the way).
func TestResolutionNaiveDoubleApprovalAppliesTwice(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s := b.flagged(t, "o-naive-approve", 990)
	p := b.propose(t, fin1, s.ID, payments.StatusCompleted)
	b.exec(t, `DROP INDEX accounting_entries_one_payment_received`)
	park := newParker()
	errs := make(chan error, 2)
	for _, by := range []payments.Staff{adm, fin2} {
		go func() { errs <- naiveApprove(context.Background(), b.pool, by, p.ID, park.hook) }()
	}
	mustWait(t, park.arrived, "naive read 1")
	mustWait(t, park.arrived, "naive read 2")
	park.let(2)
	for range 2 {
		if err := mustWait(t, errs, "naive approval"); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status = 'Completed'`, s.ID); n != 2 {
		t.Fatalf("naive: %d Completed events, want 2 (the bug)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, s.ID); n != 2 {
		t.Fatalf("naive: %d ledger entries, want 2 (the bug)", n)
	}
}

// Finance's operations are spans like the core's: a bulk check with a check per claimed session
// below it (the detached work keeps the trace), and an approval naming its session and order.
func TestFinanceOperationsAreSpans(t *testing.T) {
	t.Parallel()
	b, rec := tracedBench(t)
	s := b.flagged(t, "o-traced", 100)
	b.clock.Advance(time.Hour)

	ctx, root := rootSpan(rec)
	if _, err := b.svc.CheckNow(ctx, fin1, []string{s.ID}); err != nil {
		t.Fatal(err)
	}
	root.End()
	spans := rec.Trace(root.SpanContext().TraceID())
	if !telemetrytest.ChildOf(telemetrytest.One(t, spans, "payments.check"), telemetrytest.One(t, spans, "payments.check_now")) {
		t.Error("payments.check is not a child of payments.check_now")
	}

	p := b.propose(t, fin1, s.ID, payments.StatusFailed)
	ctx, root = rootSpan(rec)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	root.End()
	approve := telemetrytest.One(t, rec.Trace(root.SpanContext().TraceID()), "payments.resolution.approve")
	if telemetrytest.Attr(approve, payments.AttrSessionID) != s.ID || telemetrytest.Attr(approve, payments.AttrOrderID) != "o-traced" {
		t.Errorf("payments.resolution.approve attributes: %v", approve.Attributes)
	}
}

// An admin who proposed, set a finance user's password and signed in as them approved their own
// proposal (audit 8): four-eyes bound accounts, not people. An account and whoever set its
// password are now one person to it, both ways; a finance user whose password neither set
// approves as before.
func TestResolutionApproverWhosePasswordTheProposerSet(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.passwordSetBy(t, fin1, adm.Email)

	s := b.flagged(t, "o-4eyes-taken-over", 4200)
	p := b.propose(t, adm, s.ID, payments.StatusCompleted)
	_, err := b.svc.ApproveResolution(ctx, fin1, p.ID)
	wantCode(t, err, payments.EFORBIDDEN, "one of adm@example.com and fin1@example.com set the other's password")
	if cur, _ := b.svc.Get(ctx, s.ID); cur.Status != payments.StatusRegistered {
		t.Fatalf("the linked approval changed the payment: %s", cur.Status)
	}

	s2 := b.flagged(t, "o-4eyes-taken-over-2", 4200)
	p2 := b.propose(t, fin1, s2.ID, payments.StatusCompleted)
	_, err = b.svc.ApproveResolution(ctx, adm, p2.ID)
	wantCode(t, err, payments.EFORBIDDEN, "set the other's password")

	// A chain: the admin set fin1's password and, as fin1, fin3's: fin3 is the admin's too.
	fin3 := payments.Staff{Email: "fin3@example.com", Role: "finance"}
	b.passwordSetBy(t, fin3, fin1.Email)
	_, err = b.svc.ApproveResolution(ctx, fin3, p.ID)
	wantCode(t, err, payments.EFORBIDDEN, "set the other's password")

	if a, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil || a.SessionStatus != payments.StatusCompleted {
		t.Fatalf("an unlinked finance user approves = %+v %v", a, err)
	}
}

// The password is set between the approval's own check and its write (held at the resolution
// lock): the UPDATE's guard refuses it all the same.
func TestResolutionApproverLinkedWhileApproving(t *testing.T) {
	t.Parallel()
	var pool *pgxpool.Pool // the bench's, set below: the hook writes on a connection of its own
	b := newBench(t, func(c *payments.Config) {
		c.Hooks.AfterResolutionLock = func(ctx context.Context, _ string) {
			if _, err := pool.Exec(ctx, `INSERT INTO staff_users (email, role, password_hash, created_at, password_set_by)
				VALUES ($1, 'finance', 'x', now(), $2)`, fin1.Email, adm.Email); err != nil {
				panic(err)
			}
		}
	})
	pool = b.pool
	ctx := context.Background()
	s := b.flagged(t, "o-4eyes-linked-late", 4200)
	p := b.propose(t, adm, s.ID, payments.StatusCompleted)
	_, err := b.svc.ApproveResolution(ctx, fin1, p.ID)
	wantCode(t, err, payments.EFORBIDDEN, "set the other's password")
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state = 'proposed'`, p.ID); n != 1 {
		t.Fatal("the proposal was decided")
	}
}

// A flagged session with a waiting proposal to settle it by hand is not sent back to the patrol
// ("Retry now" is refused, nothing changes), and a proposal for a session that was sent back
// anyway (its flag cleared: an older replica, or by hand in SQL) is not approved: the patrol
// asks the gateway again, and its word settles the session, not the proposal.
func TestResolutionRetryWhileAProposalWaits(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.flagged(t, "o-retry-proposed", 4200)
	p := b.propose(t, fin1, s.ID, payments.StatusFailed)

	_, err := b.svc.RetryFlagged(ctx, fin2, s.ID)
	wantCode(t, err, payments.ECONFLICT, "waits for a second person")
	if cur, _ := b.svc.Get(ctx, s.ID); cur.FlaggedAt == nil || cur.NextCheckAt != nil {
		t.Fatalf("refused retry changed the session: flagged %v, due %v", cur.FlaggedAt, cur.NextCheckAt)
	}

	b.exec(t, `UPDATE payment_sessions SET flagged_at = NULL, flag_reason = NULL, next_check_at = $2 WHERE id = $1`, s.ID, b.clock.Now())
	_, err = b.svc.ApproveResolution(ctx, adm, p.ID)
	wantCode(t, err, payments.ECONFLICT, "no longer flagged")
	if cur, _ := b.svc.Get(ctx, s.ID); cur.Status != payments.StatusRegistered {
		t.Fatalf("approval settled a session the patrol drives: %s", cur.Status)
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state = 'proposed'`, p.ID); n != 1 {
		t.Fatalf("proposal no longer waits to be rejected")
	}
}

// The limits are characters, as their messages say, and as PostgreSQL's length() in the
// tables' checks counts them: 2,000 Cyrillic letters (4,000 bytes) are a valid reason.
func TestResolutionTextLimitsCountCharacters(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s := b.flagged(t, "o-cyrillic", 4200)
	r, err := b.svc.ProposeResolution(context.Background(), fin1, payments.ProposalInput{SessionID: s.ID, Outcome: payments.StatusFailed,
		Reason: strings.Repeat("я", payments.MaxReasonLength), Evidence: strings.Repeat("ж", payments.MaxEvidenceLength)})
	if err != nil || r.ID == 0 {
		t.Fatalf("propose with a reason of %d characters = %v", payments.MaxReasonLength, err)
	}
}

// An approval settles a session while the patrol's drive of it is at the gateway: the drive
// must not act after it. The session is Unknown with nothing at the gateway (Create's register
// was refused with a 5xx); the patrol claims it and searches by reference (held); meanwhile a
// Failed proposal is approved. The search finds nothing, and the drive would register the
// payment again for a session people closed, attaching a payable confirmation_url to a Failed
// payment. The terminal transition ends the patrol's lease, so the drive stops before it acts.
func TestApprovalEndsTheLeaseOfADriveInFlight(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	unknown := b.unregistered(t, "o-closed-under-drive", 700)
	p := b.propose(t, fin1, unknown.ID, payments.StatusFailed)
	registers := b.gw.Calls(fakegw.OpRegister)

	gate := b.gw.Hold(fakegw.OpFind)
	b.clock.Advance(time.Minute)
	swept := make(chan error, 1)
	go func() { _, err := b.svc.SweepOnce(ctx); swept <- err }()
	mustWait(t, gate.Arrived(), "the drive's search by reference")
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	gate.Open()
	if err := mustWait(t, swept, "the sweep"); err != nil {
		t.Fatal(err)
	}

	if n := b.gw.Calls(fakegw.OpRegister) - registers; n != 0 {
		t.Errorf("the drive sent %d registrations for a session people closed", n)
	}
	if n := b.gw.PaymentsWithReference(unknown.ID); n != 0 {
		t.Errorf("%d gateway payments for the Failed session", n)
	}
	s, err := b.svc.Get(ctx, unknown.ID)
	if err != nil || s.Status != payments.StatusFailed || s.GatewayPaymentID != "" || s.ConfirmationURL != "" {
		t.Fatalf("after the approval and the drive: %+v %v", s, err)
	}
}

// A cancel whose reverse never got an answer, settled by four eyes: the reverse operation ends
// with the settlement (nothing else would end it once the session leaves Canceling), refused
// when people say the money was taken (Completed), done with nothing to reverse when they say
// it was not (Failed).
func TestResolutionOfACancelEndsItsReverse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		outcome        payments.Status
		status, detail string
	}{
		{payments.StatusCompleted, "Refused", "the payment was captured: settled by people as Completed"},
		{payments.StatusFailed, "Succeeded", "nothing to reverse: settled by people as Failed"},
		{payments.StatusCanceled, "Succeeded", "confirmed by people"},
	} {
		t.Run(string(c.outcome), func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			s := b.registered(t, "o-cancel-settled", 100)
			b.cancelWithLostReverse(t, s)
			b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'reverse never confirmed' WHERE id = $1`, s.ID, b.clock.Now())
			p := b.propose(t, fin1, s.ID, c.outcome)
			if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
				t.Fatal(err)
			}
			if n := b.count(t, `SELECT count(*) FROM reverse_operations WHERE session_id = $1 AND status = $2 AND detail LIKE $3`,
				s.ID, c.status, c.detail+"%"); n != 1 {
				var st, d string
				_ = b.pool.QueryRow(ctx, `SELECT status, detail FROM reverse_operations WHERE session_id = $1`, s.ID).Scan(&st, &d)
				t.Fatalf("reverse operation %s %q, want %s %q", st, d, c.status, c.detail)
			}
		})
	}
}

// The customer confirmed a cancel with their code (Canceling, the reverse unanswered), and the
// gateway captured the payment before the reverse reached it; the patrol's schedule ran out and
// four eyes settled it Completed. Settled by the gateway's word, such a payment opens a
// cancel_lost_race case ("refund if the customer still wants to cancel"); settled by people,
// nothing said the customer had asked to cancel money now taken and booked, and nothing later
// would (a Completed payment the gateway holds is no contradiction). From an outside review;
// negative control: without the approval's case, no open case.
func TestApprovingCompletedForAConfirmedCancelAsksFinanceToRefund(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-lost-cancel-approved", 100)
	b.cancelWithLostReverse(t, s)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'reverse never confirmed', next_check_at = NULL WHERE id = $1`, s.ID, b.clock.Now())
	b.exec(t, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at) VALUES ($1, $2, 'sweep_exhausted', 'x', $3)`, s.ID, s.OrderID, b.clock.Now())
	p := b.propose(t, fin1, s.ID, payments.StatusCompleted)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.Check(ctx, api, s.ID); err != nil { // asked again afterwards: nothing new
		t.Fatal(err)
	}
	if got, err := b.svc.Get(ctx, s.ID); err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("session %s %v, want Completed", got.Status, err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'cancel_lost_race' AND resolved_at IS NULL`, s.ID); n != 1 {
		t.Fatalf("open cancel_lost_race cases = %d, want 1: the customer's confirmed cancel of a payment now Completed is on no list", n)
	}
}

// A settle proposal the payment outran (proposed Failed, then the gateway's capture completed
// it) can never be approved ("moved since the proposal"), and it blocked every later proposal
// of the payment — a refund above the direct limit among them — until someone rejected it by
// hand. The next proposal withdraws it (rejected by its proposer, audited with why) and is made.
// Negative control: noProposalWaiting refusing whatever waits.
func TestAProposalThePaymentOutranGivesWayToTheNext(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.flagged(t, "o-outran", 4200)
	p := b.propose(t, fin1, s.ID, payments.StatusFailed)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if cur, err := b.plain.Check(ctx, api, s.ID); err != nil || cur.Status != payments.StatusCompleted {
		t.Fatalf("setup: the capture: %s %v", cur.Status, err)
	}
	fr, err := b.svc.RefundByFinance(ctx, fin2, staffRefund(s.ID, 1000, uuid.NewString()))
	if err != nil || fr.Proposal == nil {
		t.Fatalf("a refund proposal beside the settle proposal the payment outran: %+v %v", fr, err)
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state = 'rejected' AND decided_by = $2 AND decision_note LIKE '%moved from Registered to Completed%'`, p.ID, fin2.Email); n != 1 {
		t.Errorf("the outrun proposal #%d is not withdrawn by the next one's proposer, saying why", p.ID)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2 AND detail LIKE '#' || $3::text || ' %'`, payments.AuditResolutionReject, s.ID, fmt.Sprint(p.ID)); n != 1 {
		t.Errorf("%d audit entries of the withdrawal, want 1", n)
	}
	// A proposal that still stands still refuses the next.
	_, err = b.svc.RefundByFinance(ctx, fin1, staffRefund(s.ID, 1000, uuid.NewString()))
	wantCode(t, err, payments.ECONFLICT, "already waits for approval")
}

// TestAProposalFormReadBeforeTheStateMovedProposesNothing: finance opened "Settle by hand" for
// a flagged Registered payment and wrote evidence for that state ("the customer never paid") and
// Failed; meanwhile a Check applied Authorized (the flag stays). The form carried nothing of what
// it showed, so the proposal was filed as "Authorized → Failed" under evidence written for
// Registered, and a second person's approval marked Failed a payment whose funds the gateway
// holds (the approval refuses only a payment that moved since the proposal). Now the form's
// seen (the status it showed) must be the payment's under the locks; a form without it (a page
// of the previous release) is not compared.
func TestAProposalFormReadBeforeTheStateMovedProposesNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.flagged(t, "o-stale-proposal", 1500)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	cur, err := b.svc.Check(ctx, api, s.ID)
	if err != nil || cur.Status != payments.StatusAuthorized || cur.FlaggedAt == nil {
		t.Fatalf("setup: %s flagged=%v %v", cur.Status, cur.FlaggedAt != nil, err)
	}
	in := payments.ProposalInput{SessionID: s.ID, Outcome: payments.StatusFailed, Seen: payments.StatusRegistered,
		Reason: "the customer never reached the bank's page", Evidence: "gateway dashboard: pending for 3 days"}
	_, err = b.svc.ProposeResolution(ctx, fin1, in)
	wantCode(t, err, payments.ECONFLICT, "the payment moved from Registered to Authorized since you read it; nothing was proposed")
	if f := (*payments.Error)(nil); !errors.As(err, &f) || f.Field != "seen" {
		t.Fatalf("refusal %v names no field seen", err)
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE session_id = $1`, s.ID); n != 0 {
		t.Fatalf("a form that showed Registered filed %d proposals for an Authorized payment", n)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2`, payments.AuditResolutionPropose, s.ID); n != 0 {
		t.Fatalf("propose audit entries = %d, want 0", n)
	}

	// The form of the page as it is now proposes, for the state it shows.
	in.Seen, in.Outcome = payments.StatusAuthorized, payments.StatusCompleted
	p, err := b.svc.ProposeResolution(ctx, fin1, in)
	if err != nil || p.StatusAtProposal != payments.StatusAuthorized {
		t.Fatalf("a form of the current page = %+v %v", p, err)
	}
	// A form without seen is not compared (as before).
	old := b.flagged(t, "o-old-proposal-form", 1500)
	if p := b.propose(t, fin1, old.ID, payments.StatusFailed); p.StatusAtProposal != payments.StatusRegistered {
		t.Fatalf("a form without seen = %+v", p)
	}
}

// A payment whose registration answer was lost (Unknown, the gateway holds it under our
// reference) settled Completed by four eyes has no gateway payment id: its refunds were sent for
// payment "" and refused (not_found), Failed, the customer refunded nothing and finance told the
// gateway's books differ. A refund that claims (the API's, finance's, a confirmed code's, an
// approved proposal's) checks the payment first, which finds it by its reference and records
// its id; support's code request, which claims nothing, is refused until then. An outside
// review (a staff chaos day); negative control: without the check and refundRoom's refusal, the
// refund is Failed.
func TestARefundOfAPaymentSettledByHandFindsItsGatewayPaymentFirst(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 1_000_000} })
	ctx := context.Background()
	s1, gp1 := b.settledByHand(t, "o-hand-completed-1")
	s2, gp2 := b.settledByHand(t, "o-hand-completed-2")

	_, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s1.ID, 300, uuid.NewString()))
	wantCode(t, err, payments.ECONFLICT, "check it")
	r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s1.ID, Amount: 300, RequestKey: "k"})
	if err != nil || r.Refund.Status != payments.RefundSucceeded || b.gw.Refunds(gp1) != 1 {
		t.Fatalf("the API's refund: %+v %v; %d gateway refunds of %s", r.Refund, err, b.gw.Refunds(gp1), gp1)
	}
	fr, err := b.svc.RefundByFinance(ctx, fin1, staffRefund(s2.ID, 300, uuid.NewString()))
	if err != nil || fr.Refund == nil || fr.Refund.Status != payments.RefundSucceeded || b.gw.Refunds(gp2) != 1 {
		t.Fatalf("finance's refund: %+v %v; %d gateway refunds of %s", fr, err, b.gw.Refunds(gp2), gp2)
	}
	if got, _ := b.svc.Get(ctx, s2.ID); got.GatewayPaymentID != gp2 {
		t.Fatalf("the payment's gateway id after the refund: %q, want %s", got.GatewayPaymentID, gp2)
	}
}

// A refund claimed Pending before claims looked a payment's gateway id up (a payment settled
// Completed by hand without it) was driven by the patrol for payment "": refused not_found,
// Failed, a "books differ" case, the customer refunded nothing. The drive checks the payment
// first (the Check finds it by its reference) and sends the refund to it. A review of this
// session's cd82f08; negative control: without the drive's check, Failed.
func TestAPendingRefundOfAPaymentWithoutItsGatewayIDIsSentToItsPayment(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 1_000_000} })
	ctx := context.Background()
	s, gp := b.settledByHand(t, "o-hand-pending-refund")
	// What the release before claimed: a Pending refund (its send's answer lost), due for the patrol.
	var refundID string
	if err := b.pool.QueryRow(ctx, `INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key, next_check_at, created_at, updated_at)
		VALUES (gen_random_uuid(), $1, $2, 300, 'EUR', 'Pending', 'old-release', $3, $3, $3) RETURNING id::text`,
		s.ID, s.OrderID, b.clock.Now()).Scan(&refundID); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Hour)
	if _, err := b.svc.DriveRefunds(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := b.svc.GetRefund(ctx, refundID); r.Status != payments.RefundSucceeded || b.gw.Refunds(gp) != 1 {
		t.Errorf("the patrol's drive of a Pending refund of a payment without its gateway id: %s (%s), %d refunds of %s at the gateway; want Succeeded, 1",
			r.Status, r.Detail, b.gw.Refunds(gp), gp)
	}
}
