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
	b.secondPayment(t, dup)
	b.clock.Advance(time.Minute)

	gate, done := b.reconcileSinceHeldAtFind(t, cmd, 24*time.Hour)
	mustWait(t, gate.Arrived(), "the run's first find")
	// Meanwhile the customer approves the dup session's payment; its webhook applies it.
	b.clock.Advance(time.Second)
	b.gw.SetStatus(dup.GatewayPaymentID, payments.GatewayAuthorized)
	if s, err := b.plain.Check(ctx, api, dup.ID); err != nil || s.Status != payments.StatusAuthorized {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	b.wantDuplicateFound(t, gate, done, dup, "updated within the window (and again during the run)")
}

// reconcileSinceHeldAtFind runs `pitlane reconcile --since since` on cmd with its gateway finds
// held at the gate (batch 1 stands for a window of more than 100 sessions, the command's batch).
func (b *bench) reconcileSinceHeldAtFind(t *testing.T, cmd *payments.Service, since time.Duration) (*fakegw.Gate, <-chan payments.ReconcileReport) {
	t.Helper()
	gate := b.gw.Hold(fakegw.OpFind)
	t.Cleanup(gate.Open)
	done := make(chan payments.ReconcileReport, 1)
	go func() {
		rep, err := cmd.ReconcileSince(context.Background(), since, payments.ReconcileConfig{Batch: 1})
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	return gate, done
}

// wantDuplicateFound lets the run held at gate finish and wants it to have compared s (changed
// how moved says) and found its second gateway payment.
func (b *bench) wantDuplicateFound(t *testing.T, gate *fakegw.Gate, done <-chan payments.ReconcileReport, s payments.Session, moved string) {
	t.Helper()
	gate.Open()
	b.gw.Unhold(fakegw.OpFind)
	rep := mustWait(t, done, "the run")
	if !rep.PassDone || rep.Errors != 0 {
		t.Fatalf("run: %+v", rep)
	}
	if rep.Duplicates != 1 || b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'duplicate_gateway_payment'`, s.ID) != 1 {
		t.Errorf("session %s %s never compared: checked %d, findings %+v", s.ID, moved, rep.Checked, rep.Findings)
	}
}

// A session's updated_at is its writer's clock read before its locks. A Check of session S
// read the clock at T and waited on S's order, locked by another transaction, while the run
// walked past T; it committed during the run with updated_at T, inside the window, behind the
// walk, and below the catch-ups, which began at the run's start: S's duplicate gateway payment
// went unfound and the run said "compared to the end" (an outside review). The catch-ups begin
// writeLag earlier. Negative control: catch-ups from the run's start (no duplicate).
func TestReconcileSinceComparesASessionWhoseChangeWaitedOnALock(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cmd := b.service(b.pool, "cmd-reconcile")
	late := b.registered(t, "o-late", 300) // outside the window, with a second payment
	b.secondPayment(t, late)
	b.clock.Advance(2 * time.Hour)
	first := b.registered(t, "o-first", 100)
	b.clock.Advance(time.Second)

	// The customer approves S; a Check reads its clock (T) and waits for S's order, which
	// another transaction holds (a claim, a cancel).
	b.gw.SetStatus(late.GatewayPaymentID, payments.GatewayAuthorized)
	holder, _ := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = 'o-late' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	checked := goCheck(b.plain, late.ID)
	waitLockWaiters(t, b.pool, 1)
	b.clock.Advance(2 * time.Second) // within the lock's wait
	second := b.registered(t, "o-second", 200)
	b.clock.Advance(2 * time.Second)

	gate, done := b.reconcileSinceHeldAtFind(t, cmd, time.Hour)
	mustWait(t, gate.Arrived(), "the find of "+first.ID)
	gate.Release()
	mustWait(t, gate.Arrived(), "the find of "+second.ID) // the walk is past T
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if out := mustWait(t, checked, "the check of S"); out.err != nil || out.s.Status != payments.StatusAuthorized {
		t.Fatalf("check: %s %v", out.s.Status, out.err)
	}
	b.wantDuplicateFound(t, gate, done, late, "changed inside the window and committed during the run")
}
