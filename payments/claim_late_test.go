package payments_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The patrol leaves a new Registering session alone for RegisterGrace (30 s at a 10 s gateway
// timeout) from its claim's time, so that it never registers beside the Create still doing it.
// A claim the database answered late (here the clock moves on between the claim and the
// registration) must not start a registration that could still be in flight when the patrol
// may come: 20 s after the claim the Create leaves it to the patrol (202, Registering, nothing
// sent), and the patrol registers it once. 15 s after, it registers as usual. Negative control:
// without the check (the main before this change) the late Create registers.
func TestCreateLeavesALateClaimsRegistrationToThePatrol(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		late time.Duration
		sent bool
	}{{15 * time.Second, true}, {20 * time.Second, false}} {
		t.Run(tc.late.String(), func(t *testing.T) {
			t.Parallel()
			var b *bench
			var late atomic.Int64
			b = newBench(t, func(c *payments.Config) {
				c.GatewayTimeout = 10 * time.Second
				c.Hooks.BeforeRegister = func(context.Context, string) { b.clock.Advance(time.Duration(late.Swap(0))) }
			})
			late.Store(int64(tc.late))
			res, err := b.svc.Create(context.Background(), api, payments.CreateInput{OrderID: "o-late", Amount: 500, Currency: "EUR"})
			if err != nil {
				t.Fatal(err)
			}
			if got := b.gw.Calls(fakegw.OpRegister) == 1; got != tc.sent || (res.Session.Status == payments.StatusRegistering) == tc.sent {
				t.Fatalf("the claim %s late: registered %v, status %s", tc.late, got, res.Session.Status)
			}
			if tc.sent {
				return
			}
			b.clock.Set(res.Session.CreatedAt.Add(31 * time.Second))
			if _, err := b.svc.SweepOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			s, err := b.svc.Get(context.Background(), res.Session.ID)
			if err != nil || s.Status != payments.StatusRegistered || b.gw.Calls(fakegw.OpRegister) != 1 {
				t.Fatalf("after the patrol: %s %v, %d registrations", s.Status, err, b.gw.Calls(fakegw.OpRegister))
			}
		})
	}
}

// The same for a refund's first request: a claim answered 20 s late leaves the refund Pending
// for the patrol, nothing sent; the patrol asks once. Negative control: without the check the
// late request asks the gateway.
func TestRefundLeavesALateClaimsRequestToThePatrol(t *testing.T) {
	t.Parallel()
	var b *bench
	var late atomic.Int64
	b = newBench(t, func(c *payments.Config) {
		c.GatewayTimeout = 10 * time.Second
		c.Hooks.AfterRefundLock = func(context.Context, string) { b.clock.Advance(time.Duration(late.Swap(0))) }
	})
	paid := b.completed(t, "o-late-refund", 1000)
	late.Store(int64(20 * time.Second))
	res, err := b.svc.CreateRefund(context.Background(), api, payments.RefundInput{PaymentID: paid.ID, Amount: 300})
	if err != nil {
		t.Fatal(err)
	}
	if res.Refund.Status != payments.RefundPending || b.gw.Calls(fakegw.OpRefund) != 0 {
		t.Fatalf("the late claim: %s, %d refund calls", res.Refund.Status, b.gw.Calls(fakegw.OpRefund))
	}
	b.clock.Set(res.Refund.CreatedAt.Add(31 * time.Second))
	if _, err := b.svc.DriveRefunds(context.Background()); err != nil {
		t.Fatal(err)
	}
	r, err := b.svc.GetRefund(context.Background(), res.Refund.ID)
	if err != nil || r.Status != payments.RefundSucceeded || b.gw.Calls(fakegw.OpRefund) != 1 {
		t.Fatalf("after the patrol: %s %v, %d refund calls", r.Status, err, b.gw.Calls(fakegw.OpRefund))
	}
}
