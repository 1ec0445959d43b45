package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// During a rolling change of GATEWAY_TIMEOUT, replicas with the old and the new value run side by
// side for a while. Every "may still be in flight" bound one replica leaves for the others is a
// deadline the holder writes with its own timeout (an idempotency key's locked_until, a lease's
// lease_until, a Registering session's next_check_at), never a bound the reader adds to a start
// time with its own. So a replica with a short timeout waits out a long-timeout replica's work:
// it neither takes over a request still running nor claims a session still being driven.
func TestMixedGatewayTimeoutsWaitForTheHoldersDeadline(t *testing.T) {
	t.Parallel()
	const slow, fast = 30 * time.Second, time.Second
	b := newBench(t, func(c *payments.Config) { c.GatewayTimeout = slow })
	fastSvc := b.service(b.pool, "replica-fast", func(c *payments.Config) { c.GatewayTimeout = fast })
	ctx := context.Background()

	// An API request with a key, running on the slow replica: its key is held for
	// StaleAfterFor(30 s) = 70 s.
	cl := newClient(t, b, "shop")
	xSlow := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{StaleAfter: payments.StaleAfterFor(slow)})
	xFast := payments.NewIdempotency(fastSvc, payments.IdempotencyConfig{StaleAfter: payments.StaleAfterFor(fast)})
	r := idemReq(cl.ID, "k-rolling", `{}`)
	held, err := xSlow.Acquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(3 * payments.StaleAfterFor(fast)) // 36 s: long past the fast replica's own 12 s
	if _, err := xFast.Acquire(ctx, r); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("the fast replica, 36 s into the slow one's request = %v; want busy (the holder's 70 s count)", err)
	}
	b.clock.Advance(payments.StaleAfterFor(slow) - 3*payments.StaleAfterFor(fast))
	taken, err := xFast.Acquire(ctx, r)
	if err != nil || !taken.TookOver || taken.Token == held.Token {
		t.Fatalf("at the holder's deadline = %+v %v; want a takeover", taken, err)
	}

	// A session the slow replica's patrol is driving (parked in its gateway call): its lease runs
	// LeaseFor(30 s) = 180 s. The fast replica's patrol a minute later (ten of its own leases)
	// finds nothing due and calls nothing.
	s := b.registered(t, "o-rolling", 100)
	b.clock.Advance(time.Minute)
	hold := b.gw.Hold(fakegw.OpStatus)
	slowRound := make(chan struct{})
	go func() { _, _ = b.svc.SweepOnce(ctx); close(slowRound) }()
	mustWait(t, hold.Arrived(), "the slow replica's drive")
	b.clock.Advance(10 * payments.LeaseFor(fast))
	fastRound := make(chan int, 1)
	go func() { n, _ := fastSvc.SweepOnce(ctx); fastRound <- n }()
	if n := mustWait(t, fastRound, "the fast replica's round"); n != 0 {
		t.Fatalf("the fast replica drove %d sessions inside the slow one's lease", n)
	}
	if calls := b.gw.Calls(fakegw.OpStatus); calls != 1 {
		t.Fatalf("%d status calls for session %s; want the slow drive's one", calls, s.ID)
	}
	hold.Open()
	mustWait(t, slowRound, "the slow replica's round")
}
