package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// Reconciliation review, session 32 (fixed by finance_cases.facts, migration 00740; negative
// control: factsResolved never true fails all three): a late payment normally reaches finance through its webhook or a Check, whose
// late_payment case carries Check's detail. Finance refunds it by hand at the gateway (the payment
// still reads succeeded) and resolves the case. The contradiction is the same one — same gateway
// payment, same status, same amount — yet reconciliation's next pass opens a second late_payment
// case, because it only recognises resolved cases carrying its own wording (docs/console.md: "does
// not open again a contradiction finance has resolved while it stays the same").
func TestReconcileKnowsALatePaymentCaseResolvedFromCheck(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	dead, caseID := b.latePaymentCase(t, "o-late-check")
	if _, err := b.svc.ResolveCase(ctx, fin1, caseID, "refunded the late payment by hand at the gateway, ticket FIN-9", ""); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	rep := reconcile(t, b.svc, payments.ReconcileConfig{})
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID); n != 1 {
		t.Errorf("late_payment cases for the one late payment finance already resolved = %d, want 1 (report: %d late payments found)", n, rep.LatePayments)
	}
}

// Reconciliation review, session 32 (fixed by finance_cases.facts, migration 00740; negative
// control: factsResolved never true fails all three): reconciliation's own finding "the gateway has no payment X" for a Completed
// session goes through flagMissingAtGateway, not reconcileCase, so the rule "a contradiction
// finance resolved is not opened again while it stays the same" does not hold for it: after
// finance resolves the case, every later pass (each minute in a small shop, for 7 days) opens a
// fresh gateway_mismatch case for the same lost payment.
func TestReconcileDoesNotReopenAResolvedLostPayment(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-lost", 900)
	b.gw.Forget(s.GatewayPaymentID) // the gateway lost the payment we completed
	if rep := reconcile(t, b.svc, payments.ReconcileConfig{}); rep.Mismatches != 1 || !rep.PassDone {
		t.Fatalf("first pass: %+v", rep)
	}
	var caseID int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID).Scan(&caseID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ResolveCase(ctx, fin1, caseID, "gateway support confirmed the capture by phone, ticket FIN-12", ""); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		b.clock.Advance(time.Minute)
		reconcile(t, b.svc, payments.ReconcileConfig{})
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, s.ID).Scan(&caseID); err != nil {
			t.Fatal(err)
		}
		if caseID != 0 {
			if _, err := b.svc.ResolveCase(ctx, fin1, caseID, "same as FIN-12", ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); n != 1 {
		t.Errorf("gateway_mismatch cases for the one lost payment finance already resolved = %d, want 1", n)
	}
}

// Reconciliation review, session 32 (fixed by finance_cases.facts, migration 00740; negative
// control: factsResolved never true fails all three): the same for an active session whose gateway payment is for another amount:
// the apply path (flagForFinance) opens a gateway_mismatch case; finance resolves it; each later
// pass opens another for the unchanged contradiction.
func TestReconcileDoesNotReopenAResolvedAmountMismatch(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-amount", 500)
	b.gw.SetAmount(s.GatewayPaymentID, 5000, s.Currency)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	var caseID int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID).Scan(&caseID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ResolveCase(ctx, fin1, caseID, "asked the gateway to correct the amount, ticket FIN-13", ""); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		b.clock.Advance(time.Minute)
		reconcile(t, b.svc, payments.ReconcileConfig{})
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); n != 1 {
		t.Errorf("gateway_mismatch cases for the one amount mismatch finance already resolved = %d, want 1", n)
	}
}

// Finance resolves a late_payment case (refunded by hand at the gateway) while the late
// payment's webhook or a Check finds the same fact. ResolveCase locks the case row only: the
// finder read the facts before the resolution committed (not resolved), its insert waited for
// the case row and went through once the resolution took it out of finance_cases_one_open — a
// second open case of the fact finance had just resolved. factsResolved waits for a resolution
// in flight first. From an outside review; the resolution is held before its commit by its
// audit row's lock. Negative control: without the wait, 2 cases (1 open).
func TestALatePaymentResolvedWhileAFinderRacesOpensNoSecondCase(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	dead, caseID := b.latePaymentCase(t, "o-late-race")
	b.clock.Advance(time.Minute)

	// Hold ResolveCase between its UPDATE of the case and its commit: its audit row waits.
	holder, _ := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `LOCK TABLE audit_log IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	resolved := make(chan error, 1)
	go func() {
		_, err := b.svc.ResolveCase(ctx, fin1, caseID, "refunded the late payment by hand at the gateway, ticket FIN-10", "")
		resolved <- err
	}()
	waitLockWaiters(t, b.pool, 1)
	// The webhook of the same late payment arrives meanwhile (a Check: the same apply).
	checked := make(chan error, 1)
	go func() {
		_, err := b.svc.Check(ctx, api, dead.ID)
		checked <- err
	}()
	waitLockWaiters(t, b.pool, 2)
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mustWait(t, resolved, "the resolution"); err != nil {
		t.Fatal(err)
	}
	if err := mustWait(t, checked, "the check"); err != nil {
		t.Fatal(err)
	}
	all := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID)
	open := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment' AND resolved_at IS NULL`, dead.ID)
	if all != 1 || open != 0 {
		t.Fatalf("late_payment cases for the one late payment = %d (%d open after finance resolved it), want 1 (0 open)", all, open)
	}
}

// latePaymentCase makes a Failed session of order whose money the gateway took after all, and
// has Check (the late payment's webhook, or staff pressing Check) open its late_payment case.
func (b *bench) latePaymentCase(t *testing.T, order string) (payments.Session, int64) {
	t.Helper()
	ctx := context.Background()
	dead := b.failed(t, order, 100)
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded) // the late money
	if _, err := b.plain.Check(ctx, api, dead.ID); err != nil {
		t.Fatal(err)
	}
	var caseID int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID).Scan(&caseID); err != nil {
		t.Fatalf("setup: Check opened no late_payment case: %v", err)
	}
	return dead, caseID
}
