package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A gateway that ignored our key holds two payments under session
// S's reference: A (S's own) and B, both pending. Reconciliation opens a duplicate case; finance
// reads "B pending, nothing taken" and resolves it. Then the customer pays A, the normal way:
// S is Completed by its Check. Nothing changed about B, the payment the duplicate case is about,
// yet the next reconciliation opens the duplicate case again, because the resolved case's facts
// carried the own payment's status (A pending) and A is now succeeded (an outside review). A
// duplicate case's facts name the other payments only. Negative control: paymentFacts(found) as
// the facts opens it again.
func TestAResolvedDuplicateStaysResolvedWhenTheOwnPaymentIsPaid(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-audit-dup", 700)
	second := b.secondPayment(t, s)
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	b.resolveOpenCase(t, s.ID, payments.CaseDuplicatePayment, "B is pending at the gateway: nothing taken, it expires by itself")
	// The customer pays on A's page; its Check completes S.
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if got, err := b.plain.Check(ctx, api, s.ID); err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("setup: %s %v", got.Status, err)
	}
	if p, _ := b.gw.Payment(second.ID); p.Status != payments.GatewayPending {
		t.Fatalf("setup: B is %s", p.Status)
	}
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2`, s.ID, payments.CaseDuplicatePayment); n != 1 {
		var d string
		_ = b.pool.QueryRow(ctx, `SELECT detail FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL`, s.ID, payments.CaseDuplicatePayment).Scan(&d)
		t.Errorf("duplicate cases for the one duplicate B (unchanged, pending) = %d, want 1; reopened as %q", n, d)
	}
}

// A gateway that ignored our key holds two payments under session
// S's reference: A (S's own) and B. The customer paid B; A expired, and S's Check made S Failed.
// Reconciliation finds B's money and opens two finance cases about it — a duplicate case and a
// late_payment case — each asking finance to give B's money back: one payment, two cases (an
// outside review). The late_payment case is B's; A expired and took nothing. Negative control:
// duplicate facts with the paid payments of a Failed session open both.
func TestOneLatePaymentOpensOneCase(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-audit-late-dup", 700)
	second := b.secondPayment(t, s)
	b.gw.SetStatus(second.ID, payments.GatewaySucceeded)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayExpired)
	if got, err := b.plain.Check(ctx, api, s.ID); err != nil || got.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", got.Status, err)
	}
	b.clock.Advance(time.Minute)
	rep := reconcile(t, b.svc, payments.ReconcileConfig{})
	rows, err := b.pool.Query(ctx, `SELECT kind || ': ' || detail FROM finance_cases WHERE session_id = $1 ORDER BY id`, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, c)
	}
	if len(cases) != 1 {
		t.Errorf("finance cases about the one payment %s = %d, want 1 (report: %d late, %d duplicates):\n%v", second.ID, len(cases), rep.LatePayments, rep.Duplicates, cases)
	}
}

// A session whose registration answer was lost (Unknown, no gateway
// id) is settled Completed by four eyes: the customer paid, the gateway's payment A is
// succeeded. The gateway's search index still holds an older copy of A (pending: Stripe's lags by
// up to an hour). Reconciliation judges a session's own payment by its id "always (a search index
// may lag)" — but for a session with no id attached it judges the search's copy, and opens a
// false gateway_mismatch case ("the gateway says pending for the Completed session's payment")
// against a payment that is succeeded (an outside review). The payment it would pick is asked for
// by its id. Negative control: judging pickPayment(found) as listed opens the false case.
func TestReconcileJudgesAnUnattachedOwnPaymentByItsID(t *testing.T) {
	t.Parallel()
	judgedByID(t, false)
}

// The same for Check (gatewayState). Negative control: attaching pickPayment(found) as listed.
func TestCheckJudgesAnUnattachedOwnPaymentByItsID(t *testing.T) {
	t.Parallel()
	judgedByID(t, true)
}

func judgedByID(t *testing.T, viaCheck bool) {
	b := newBench(t)
	ctx := context.Background()
	lg := &laggingSearch{Gateway: b.gw, stale: map[string]payments.GatewayStatus{}}
	svc := payments.NewService(b.pool, payments.Config{Gateway: lg, Clock: b.clock, ReplicaID: "replica-lag",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	s := b.unregistered(t, "o-audit-people", 500)
	// The registration had reached the gateway after all; the customer paid it.
	a, err := b.gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: s.ID, Reference: s.ID, Amount: s.Amount, Currency: s.Currency})
	if err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(a.ID, payments.GatewaySucceeded)
	p := b.propose(t, fin1, s.ID, payments.StatusCompleted)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.svc.Get(ctx, s.ID); got.Status != payments.StatusCompleted || got.GatewayPaymentID != "" {
		t.Fatalf("setup: %s %q", got.Status, got.GatewayPaymentID)
	}
	lg.stale[a.ID] = payments.GatewayPending // the index has not seen the capture yet
	if viaCheck {
		// Check of the same session (a person's Check now) judges the payment it attaches by
		// its id too.
		if got, err := svc.Check(ctx, api, s.ID); err != nil || got.Status != payments.StatusCompleted || got.GatewayPaymentID != a.ID {
			t.Fatalf("Check: %s %q %v, want Completed attached to %s", got.Status, got.GatewayPaymentID, err, a.ID)
		}
		if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1`, s.ID); n != 0 {
			t.Fatalf("Check of a Completed session whose payment is succeeded opened %d cases from the search's stale copy", n)
		}
		return
	}
	b.clock.Advance(time.Minute)
	rep := reconcile(t, svc, payments.ReconcileConfig{})
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); n != 0 || rep.Mismatches != 0 {
		var d string
		_ = b.pool.QueryRow(ctx, `SELECT detail FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID).Scan(&d)
		t.Errorf("a false gateway_mismatch case from the search's stale copy of succeeded payment %s (%d cases, %d mismatches reported): %q", a.ID, n, rep.Mismatches, d)
	}
}

// getLags: the search lists a payment whose GET by id does not answer yet (404 not_found).
type getLags struct {
	*fakegw.Gateway
	missing map[string]bool
}

func (g *getLags) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	if g.missing[id] {
		return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: fakegw.OpStatus, HTTPStatus: 404, Code: "not_found"}
	}
	return g.Gateway.Status(ctx, id)
}

// An Unknown session (registration answer lost) whose payment the search lists but whose
// GET by id answers not_found for a moment. Before b928f3e Check attached the listed payment;
// now gatewayState's new Status call returns a definitive not_found and check() takes it for
// "the payment WE ATTACHED does not exist": flagMissingAtGateway flags the session (the sweeper
// stops asking: next_check_at NULL) and opens a gateway_mismatch case naming payment "" (a
// review of the session's diff). The Check answers that the gateway did not answer, and the
// next one, the GET caught up, attaches the payment. Negative control: flagging on any
// not_found, as before.
func TestACheckWhoseSearchIsAheadOfItsGetAsksAgain(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	lg := &getLags{Gateway: b.gw, missing: map[string]bool{}}
	svc := payments.NewService(b.pool, payments.Config{Gateway: lg, Clock: b.clock, ReplicaID: "replica-lag",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	s := b.unregistered(t, "o-audit-getlag", 500)
	a, err := b.gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: s.ID, Reference: s.ID, Amount: s.Amount, Currency: s.Currency})
	if err != nil {
		t.Fatal(err)
	}
	lg.missing[a.ID] = true
	if _, err := svc.Check(ctx, api, s.ID); payments.ErrorCode(err) != payments.EUNAVAIL {
		t.Fatalf("Check while the GET lags: %v, want unavailable (asked again)", err)
	}
	var n int
	var detail string
	_ = b.pool.QueryRow(ctx, `SELECT count(*), coalesce(max(detail),'') FROM finance_cases WHERE session_id = $1`, s.ID).Scan(&n, &detail)
	var flagged bool
	if err := b.pool.QueryRow(ctx, `SELECT flagged_at IS NOT NULL FROM payment_sessions WHERE id = $1`, s.ID).Scan(&flagged); err != nil {
		t.Fatal(err)
	}
	if n != 0 || flagged {
		t.Fatalf("a payment the search lists (GET not caught up) flagged the session (%v) and opened %d case(s): %q", flagged, n, detail)
	}
	lg.missing[a.ID] = false
	if got, err := svc.Check(ctx, api, s.ID); err != nil || got.GatewayPaymentID != a.ID || got.Status != payments.StatusRegistered {
		t.Fatalf("Check once the GET caught up: %s %q %v, want Registered with %s", got.Status, got.GatewayPaymentID, err, a.ID)
	}
}
