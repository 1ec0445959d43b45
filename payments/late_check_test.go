package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A patrol drive's look at a payment is answered after its lease ran out. Meanwhile another
// replica took the payment over, got no answer at its last look and flagged it; finance settled
// it Failed by hand with four eyes (the customer had left; the gateway showed nothing taken).
// Then the customer pays after all, and the first look's answer lands: succeeded. The late drive
// has lost its lease, so it writes no transition — but the gateway's word contradicts the
// outcome settled meanwhile, and it must reach finance as a case, not be dropped in silence (the
// customer paid for an order the shop calls failed). Fails without the lost-lease look in
// applyGatewayPayment.
func TestLateCheckAnswerAfterTheLeaseRanOutStillReachesFinance(t *testing.T) {
	t.Parallel()
	b, other := twoReplicasMinuteLease(t)
	ctx := context.Background()
	sess := b.registered(t, "o-late-check", 1000)

	// The schedule's first two looks get no answer.
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 2)
	for range 2 {
		b.clock.Advance(time.Hour)
		if n, err := b.svc.SweepOnce(ctx); err != nil || n != 1 {
			t.Fatalf("patrol drove %d (%v)", n, err)
		}
	}
	if n := b.count(t, `SELECT check_attempts FROM payment_sessions WHERE id = $1`, sess.ID); n != 2 {
		t.Fatalf("setup: check_attempts = %d", n)
	}

	// Replica A's last look: the gateway is slow to answer it.
	b.clock.Advance(time.Hour)
	gate := b.gw.Hold(fakegw.OpStatus)
	defer gate.Open()
	doneA := make(chan struct{})
	go func() { _, _ = b.svc.SweepOnce(ctx); close(doneA) }()
	mustWait(t, gate.Arrived(), "A's look")
	b.gw.Unhold(fakegw.OpStatus)

	// A's lease runs out; replica B takes the payment over, gets no answer, and its release flags it.
	b.clock.Advance(time.Minute + time.Second)
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	if n, err := other.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("B drove %d: %v", n, err)
	}
	got, _ := b.svc.Get(ctx, sess.ID)
	if got.FlaggedAt == nil || !got.Status.Active() {
		t.Fatalf("setup: after B's look the payment is %s flagged %v, want active and flagged", got.Status, got.FlaggedAt)
	}

	// Finance settles it Failed by hand, four eyes.
	p, err := b.svc.ProposeResolution(ctx, fin1, payments.ProposalInput{SessionID: sess.ID, Outcome: payments.StatusFailed,
		Reason: "the customer left; nothing was taken", Evidence: "gateway dashboard: no capture"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, sess.ID); n != 0 {
		t.Fatalf("setup: %d open cases after the approval", n)
	}

	// The customer pays after all; A's look is answered: succeeded. A finds its lease lost.
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	gate.Open()
	mustWait(t, doneA, "A's round")
	got, _ = b.svc.Get(ctx, sess.ID)
	if got.Status != payments.StatusFailed {
		t.Errorf("after A's late answer the payment is %s, want Failed as settled by hand (never written over)", got.Status)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL AND kind = $2`,
		sess.ID, payments.CaseLatePayment); n != 1 {
		t.Errorf("open late_payment cases = %d, want 1: the gateway took money for a payment settled Failed here", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, sess.ID); n != 0 {
		t.Errorf("ledger entries = %d, want none (a case for finance, not an entry)", n)
	}
}

// twoReplicasMinuteLease is a bench on the short schedule with one-minute leases, and a second
// replica (replica-b) on the same database: a drive whose lease runs out while the gateway holds
// its call, and the replica that takes the row over.
func twoReplicasMinuteLease(t *testing.T) (*bench, *payments.Service) {
	t.Helper()
	lease := func(c *payments.Config) { c.LeaseDuration = time.Minute }
	b := newBench(t, shortSchedule, lease)
	return b, b.service(testdb.Pool(t, b.url), "replica-b", shortSchedule, lease)
}
