package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// driveRefund runs a Check before it sends a refund of a payment without its gateway id, and the
// Check hands the drive's patrol slot back (its last gateway call, as for a session's drive) —
// but the refund's own call is still ahead. Width 1: R1's drive checked, handed its slot back and
// sent its refund (held at the gateway); the producer started R2's drive in the freed slot and it
// talked to the gateway too: two gateway calls of a patrol of width 1 at once. The drive retakes
// a slot before it sends. A review of this session's 5290ff5; negative control: without
// retakeSlot, two calls in flight.
func TestARefundDrivesCheckKeepsThePatrolsWidth(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) {
		c.SweepConcurrency = 1
		c.RefundDirectLimit = map[string]int64{"EUR": 1_000_000}
	})
	ctx := context.Background()
	for i, order := range []string{"o-slot-1", "o-slot-2"} {
		s, _ := b.settledByHand(t, order)
		if _, err := b.pool.Exec(ctx, `INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key, next_check_at, created_at, updated_at)
			VALUES (gen_random_uuid(), $1, $2, 300, 'EUR', 'Pending', 'old-release', $3, $3, $3)`,
			s.ID, s.OrderID, b.clock.Now().Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	b.clock.Advance(time.Hour)
	gate := b.gw.Hold(fakegw.OpRefund)
	driven := make(chan error, 1)
	go func() { _, err := b.svc.DriveRefunds(ctx); driven <- err }()
	first := mustWait(t, gate.Arrived(), "R1's refund sent (held at the gateway)")
	var second string
	select {
	case second = <-gate.Arrived(): // another drive's call while the first is unanswered
	case <-time.After(time.Second): // bounded: a patrol within its width sends none while the first waits
	}
	gate.Open()
	if err := <-driven; err != nil {
		t.Fatal(err)
	}
	if second != "" {
		t.Fatalf("a patrol of width 1 had 2 gateway refund calls in flight at once (%s and %s): the refund drive's Check "+
			"handed its slot back (handOff) before the drive's own Refund call", first, second)
	}
}
