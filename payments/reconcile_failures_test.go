package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// MaxFailures is the runs in a row that may fail on the same session. The count lived in the
// cursor with nothing saying whose it was: session A failed twice, then settled (a Check) and
// left the window, and the next session B was skipped after its first failure, a paid payment
// left Registered until the next pass (an outside review). The count is now of one session
// (reconcile_cursors.failing_id, migration 00900). Negative control: without the reset, B is
// skipped and stays Registered.
func TestReconcileFailureCountIsOfOneSession(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	a := b.registered(t, "o-a", 100)
	b.clock.Advance(time.Second)
	bb := b.registered(t, "o-b", 200)
	b.gw.SetStatus(bb.GatewayPaymentID, payments.GatewaySucceeded) // B is paid: reconciliation should drive it
	b.clock.Advance(time.Second)
	cfg := payments.ReconcileConfig{MaxFailures: 3}
	b.gw.Fail(fakegw.OpFind, fakegw.Transient, 2)
	for run := range 2 {
		if rep := reconcile(t, b.svc, cfg); rep.Errors != 1 || rep.Skipped != 0 {
			t.Fatalf("run %d on A: %+v", run, rep)
		}
	}
	// A settles through its webhook / a Check: it moves past the pass's window.
	b.clock.Advance(time.Second)
	b.gw.SetStatus(a.GatewayPaymentID, payments.GatewayDeclined)
	if s, err := b.plain.Check(ctx, api, a.ID); err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	// B's first failure.
	b.gw.Fail(fakegw.OpFind, fakegw.Transient, 1)
	rep := reconcile(t, b.svc, cfg)
	if rep.Skipped != 0 {
		t.Errorf("B skipped after its FIRST failure (MaxFailures 3 is per session): %+v", rep)
	}
	rep = reconcile(t, b.svc, cfg)
	var st payments.Status
	if err := b.pool.QueryRow(ctx, `SELECT status FROM payment_sessions WHERE id = $1`, bb.ID).Scan(&st); err != nil {
		t.Fatal(err)
	}
	if st != payments.StatusCompleted {
		t.Errorf("B (paid at the gateway) not compared in this pass: status %s, next run %+v", st, rep)
	}
}
