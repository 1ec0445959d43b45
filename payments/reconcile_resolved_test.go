package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Outside review (reconciliation); each of the three tests below failed on the code before.
//
// Finance resolves a late_payment case (the late money was refunded by hand at the gateway, whose
// payment stays "succeeded": refunds do not change a payment's status). The discrepancy is the
// same one — the same gateway payment, the same status — yet the patrol's next pass opens a new
// late_payment case for it, and every pass after that does again, for as long as the session is
// within the 7-day lookback. Finance's queue refills with work already done (and the runbook's
// "refund the late payment" invites a second refund).
func TestReconcileDoesNotReopenAContradictionFinanceResolved(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	dead := b.failed(t, "o-dead", 100)
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded) // late money, no webhook

	if rep := reconcile(t, b.svc, payments.ReconcileConfig{}); rep.LatePayments != 1 || !rep.PassDone {
		t.Fatalf("first pass: %+v", rep)
	}
	var caseID int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID).Scan(&caseID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ResolveCase(ctx, fin1, caseID, "refunded the late payment by hand at the gateway, ticket FIN-9", ""); err != nil {
		t.Fatal(err)
	}
	for range 3 { // each pass: the case finance closed comes back; finance closes it again
		b.clock.Advance(time.Minute)
		reconcile(t, b.svc, payments.ReconcileConfig{})
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, dead.ID).Scan(&caseID); err != nil {
			t.Fatal(err)
		}
		if caseID != 0 {
			if _, err := b.svc.ResolveCase(ctx, fin1, caseID, "already refunded, see FIN-9", ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID); n != 1 {
		t.Errorf("late_payment cases for the one late payment finance already resolved = %d, want 1 (open now: %d)", n,
			b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, dead.ID))
	}
	// Another contradiction (the gateway's payment now holds another amount) is a new case.
	b.gw.SetAmount(dead.GatewayPaymentID, 250, dead.Currency)
	b.clock.Advance(time.Minute)
	if rep := reconcile(t, b.svc, payments.ReconcileConfig{}); rep.LatePayments != 1 {
		t.Errorf("a changed contradiction: %+v, want one late payment found", rep)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment' AND resolved_at IS NULL`, dead.ID); n != 1 {
		t.Errorf("open late_payment cases after the gateway's payment changed = %d, want 1", n)
	}
}

// A session Completed by people (four-eyes) before the gateway's id was known, with nothing at the
// gateway under its reference: docs/console.md ("Later, the gateway may disagree (a webhook,
// reconciliation, a Check) ... gateway_mismatch when it ... has no payment at all under the
// reference of a session Completed by people") and ReconcileReport.Mismatches ("a payment it
// lost") promise a gateway_mismatch case. Check opens it; reconciliation — the only thing that
// looks at a Completed session on its own — compares it and finds nothing.
func TestReconcileFindsACompletedSessionWithNothingAtTheGateway(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.unregistered(t, "o-people", 500) // Unknown, no gateway id, nothing at the gateway
	p := b.propose(t, fin1, s.ID, payments.StatusCompleted)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.svc.Get(ctx, s.ID); got.Status != payments.StatusCompleted || got.GatewayPaymentID != "" {
		t.Fatalf("setup: %s %q", got.Status, got.GatewayPaymentID)
	}
	b.clock.Advance(time.Minute)
	rep := reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.Checked != 1 {
		t.Fatalf("reconcile: %+v", rep)
	}
	byReconcile := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID)
	if rep.Mismatches != 1 || byReconcile != 1 {
		t.Errorf("reconciliation of a Completed session with no gateway payment at all: %d mismatches reported, %d gateway_mismatch cases; want 1 and 1", rep.Mismatches, byReconcile)
	}
	// Control: Check, on the same session, opens the case.
	if _, err := b.svc.Check(ctx, api, s.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); n != 1 {
		t.Fatalf("control: Check opened %d gateway_mismatch cases, want 1", n)
	}
}

// `pitlane reconcile` cut half-way (Ctrl-C, a timer's timeout, or a database error): the CLI
// prints the report ("1: the run could not finish …; what it did is printed"), but ReconcileSince
// returns before it lists the cases it opened, so the printout says "0 cases opened" beside a
// late_payment finding whose case it did open.
func TestReconcileSinceCutHalfWayReportsTheCasesItOpened(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cmd := b.service(b.pool, "cmd-reconcile")
	for _, order := range []string{"o-late-1", "o-late-2"} {
		s := b.failed(t, order, 100)
		b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	}
	b.clock.Advance(time.Minute)
	gate := b.gw.Hold(fakegw.OpFind)
	t.Cleanup(gate.Open)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make(chan reconcileOut, 1)
	go func() {
		rep, err := cmd.ReconcileSince(runCtx, time.Hour, payments.ReconcileConfig{})
		out <- reconcileOut{"cmd", rep, err}
	}()
	mustWait(t, gate.Arrived(), "the first find")
	gate.Release()
	mustWait(t, gate.Arrived(), "the second find")
	cancel() // the operator's Ctrl-C
	got := mustWait(t, out, "the cut run")
	if got.err == nil || !got.rep.Leader || got.rep.LatePayments != 1 {
		t.Fatalf("cut run: %+v %v", got.rep, got.err)
	}
	opened := b.count(t, `SELECT count(*) FROM finance_cases WHERE kind = 'late_payment'`)
	if len(got.rep.CasesOpened) != opened {
		t.Errorf("the cut run opened %d case(s) but reports %d opened (CasesOpened %+v); the CLI prints \"%d cases opened\"",
			opened, len(got.rep.CasesOpened), got.rep.CasesOpened, len(got.rep.CasesOpened))
	}
}
