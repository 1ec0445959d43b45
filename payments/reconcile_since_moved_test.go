package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// `pitlane reconcile --since` compares every session updated within the window. One not reached
// yet that changed state while the run was on an earlier one moved past the run's top
// (updated_at <= its start) and was never compared: its duplicate gateway payment went unfound
// and the run said "compared to the end" (an outside review). The run walks what changed since
// it began until nothing did. Negative control: without the catch-up, no duplicate, no case.
func TestReconcileSinceComparesASessionThatMovedDuringTheRun(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cmd := b.service(b.pool, "cmd-reconcile")
	b.registered(t, "o-first", 100)
	b.clock.Advance(time.Second)
	dup := b.registered(t, "o-dup", 300)
	b.gw.IgnoreKeys(true)
	if _, err := b.gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: dup.ID, Reference: dup.ID, Amount: dup.Amount, Currency: dup.Currency}); err != nil {
		t.Fatal(err)
	}
	b.gw.IgnoreKeys(false)
	b.clock.Advance(time.Minute)

	gate := b.gw.Hold(fakegw.OpFind)
	done := make(chan payments.ReconcileReport, 1)
	go func() {
		// Batch 1 stands for a window of more than 100 sessions (the command's batch).
		rep, err := cmd.ReconcileSince(context.Background(), 24*time.Hour, payments.ReconcileConfig{Batch: 1})
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	mustWait(t, gate.Arrived(), "the run's first find")
	// Meanwhile the customer approves the dup session's payment; its webhook applies it.
	b.clock.Advance(time.Second)
	b.gw.SetStatus(dup.GatewayPaymentID, payments.GatewayAuthorized)
	if s, err := b.plain.Check(ctx, api, dup.ID); err != nil || s.Status != payments.StatusAuthorized {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	gate.Open()
	b.gw.Unhold(fakegw.OpFind)
	rep := mustWait(t, done, "the run")
	if !rep.PassDone || rep.Errors != 0 {
		t.Fatalf("run: %+v", rep)
	}
	if rep.Duplicates != 1 || b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'duplicate_gateway_payment'`, dup.ID) != 1 {
		t.Errorf("session %s updated within the window (and again during the run) never compared: checked %d, findings %+v", dup.ID, rep.Checked, rep.Findings)
	}
}
