package handlers_test

import (
	"net/http"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// TestAKeylessRefundRetryThatWaitedMostOfItsBoundIsOneRefund: a keyless intent stays alive past
// its window for a request that read its time inside it and reached the key late. The grace was
// first the stale bound (2 × GATEWAY_TIMEOUT + 10 s = 30 s), while a request may wait up to its
// own bound, web.RequestTimeoutFor (3 × GATEWAY_TIMEOUT + 25 s = 55 s), for a connection: R1 read
// 14m59s on replica B and waited 40 s; its client retried after 31 s (R2 at 15m31s), which found
// the intent past the grace, started a new use and refunded again (a review of the fix). The
// grace is IntentGraceFor: the request's bound and 5 s for the clocks.
func TestAKeylessRefundRetryThatWaitedMostOfItsBoundIsOneRefund(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	stale, bound := payments.StaleAfterFor(0), web.RequestTimeoutFor(10*time.Second) // the default GATEWAY_TIMEOUT
	if wait := 40 * time.Second; wait <= stale || wait >= bound {
		t.Fatalf("setup: wait %s must be above StaleAfter %s and below the request bound %s", wait, stale, bound)
	}
	for _, gt := range []time.Duration{10 * time.Millisecond, time.Second, 10 * time.Second, 10 * time.Minute} {
		if grace := payments.IntentGraceFor(gt); grace < web.RequestTimeoutFor(gt) {
			t.Errorf("GATEWAY_TIMEOUT %s: an intent's grace %s is shorter than a request's bound %s", gt, grace, web.RequestTimeoutFor(gt))
		}
	}
	p := b.completedPayment(t, "o-probe-renew-bound", 1000)
	lag := payments.NewManualClock(t0)
	_, eB := b.server(t, b.pool, "replica-b", benchOpt{core: func(c *payments.Config) { c.Clock = lag }})
	refund := post(refundsPath(p.ID), `{"amount":100}`)

	b.clock.Set(t0.Add(10 * time.Minute))
	first := wantRefund(t, b.do(refund), http.StatusCreated) // the intent expires at t0+15m
	// R1 read its time at 14m59s on replica B and waits (40 s) for a pool connection.
	lag.Set(t0.Add(15*time.Minute - time.Second))
	// R2, the client's retry 32 s after R1, reaches replica A first.
	b.clock.Set(t0.Add(15*time.Minute + 31*time.Second))
	r2 := wantRefund(t, b.do(refund), http.StatusCreated)
	// R1 reaches the key at 15m39s.
	b.clock.Set(t0.Add(15*time.Minute + 39*time.Second))
	r1 := wantRefund(t, b.on(eB, refund), http.StatusCreated)
	t.Logf("first %s, R1 (14m59s) %s, R2 (15m31s) %s", first.ID, r1.ID, r2.ID)
	if n, calls := b.refunds(t), b.gw.Calls(fakegw.OpRefund); n != 1 || calls != 1 {
		t.Fatalf("a chain of identical keyless refunds at 10m, 14m59s (waited 40 s, within its %s bound) and 15m31s: refunds = %d, gateway refund calls = %d; want 1 and 1",
			bound, n, calls)
	}
}
