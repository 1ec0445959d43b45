package handlers_test

import (
	"net/http"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// TestAKeylessRefundRetryInsideTheWindowOvertakenByALaterOneIsOneRefund: a chain of identical
// keyless refunds, each within 5 minutes of the one before, is one refund (contract). The first
// at 10m; the shop's retry R1 at 14m59s reaches replica B, which reads its time and then waits (a
// pool connection; B's lagging clock stands in for the wait, as in
// TestKeylessRefundRetriedAtTheWindowsEdgeOutlivesTheReaper); the shop's client gives up on it
// and retries (R2) at 15m00.5s through replica A, which found the intent expired (not reaped),
// started a new use and refunded again; R1 then replayed R2's refund: two refunds for one chain
// (an outside review of clock-order decisions). An intent lives IntentGraceFor past its window
// for such a request.
func TestAKeylessRefundRetryInsideTheWindowOvertakenByALaterOneIsOneRefund(t *testing.T) {
	t.Parallel()
	overtakenChain(t, "o-probe-renew-edge", 15*time.Minute+500*time.Millisecond, 0)
}

// TestAKeylessRefundRetryThatWaitedMostOfItsBoundIsOneRefund: the grace was first the stale
// bound (2 × GATEWAY_TIMEOUT + 10 s = 30 s), while a request may wait up to its own bound,
// web.RequestTimeoutFor (3 × GATEWAY_TIMEOUT + 25 s = 55 s), for a connection: R1 read 14m59s on
// replica B and waited 40 s; its client retried after 31 s (R2 at 15m31s), which found the intent
// past the grace, started a new use and refunded again (a review of the fix). The grace is
// IntentGraceFor: the request's bound and 5 s for the clocks.
func TestAKeylessRefundRetryThatWaitedMostOfItsBoundIsOneRefund(t *testing.T) {
	t.Parallel()
	stale, bound := payments.StaleAfterFor(0), web.RequestTimeoutFor(10*time.Second) // the default GATEWAY_TIMEOUT
	if wait := 40 * time.Second; wait <= stale || wait >= bound {
		t.Fatalf("setup: wait %s must be above StaleAfter %s and below the request bound %s", wait, stale, bound)
	}
	for _, gt := range []time.Duration{10 * time.Millisecond, time.Second, 10 * time.Second, 10 * time.Minute} {
		if grace := payments.IntentGraceFor(gt); grace < web.RequestTimeoutFor(gt) {
			t.Errorf("GATEWAY_TIMEOUT %s: an intent's grace %s is shorter than a request's bound %s", gt, grace, web.RequestTimeoutFor(gt))
		}
	}
	overtakenChain(t, "o-probe-renew-bound", 15*time.Minute+31*time.Second, 15*time.Minute+39*time.Second)
}

// overtakenChain plays a chain of identical keyless refunds of order's payment: the first at 10m
// (the intent expires at 15m); R1 reads its time at 14m59s on replica B (a lagging clock stands
// in for its wait) and waits; R2, its client's retry, reaches replica A first at r2; R1 then
// reaches the key (at r1, when not 0, on replica A's clock). One refund, one gateway call.
func overtakenChain(t *testing.T, order string, r2, r1 time.Duration) {
	t.Helper()
	b := newAPIBench(t)
	p := b.completedPayment(t, order, 1000)
	lag := payments.NewManualClock(t0)
	_, eB := b.server(t, b.pool, "replica-b", benchOpt{core: func(c *payments.Config) { c.Clock = lag }})
	refund := post(refundsPath(p.ID), `{"amount":100}`)
	b.clock.Set(t0.Add(10 * time.Minute))
	first := wantRefund(t, b.do(refund), http.StatusCreated)
	lag.Set(t0.Add(15*time.Minute - time.Second))
	b.clock.Set(t0.Add(r2))
	second := wantRefund(t, b.do(refund), http.StatusCreated)
	if r1 != 0 {
		b.clock.Set(t0.Add(r1))
	}
	waited := wantRefund(t, b.on(eB, refund), http.StatusCreated)
	t.Logf("first %s, R1 (14m59s) %s, R2 (%s) %s", first.ID, waited.ID, r2, second.ID)
	if n, calls := b.refunds(t), b.gw.Calls(fakegw.OpRefund); n != 1 || calls != 1 {
		t.Fatalf("a chain of identical keyless refunds at 10m, 14m59s (arriving late) and %s: refunds = %d, gateway refund calls = %d; want 1 and 1",
			r2, n, calls)
	}
}

// TestAKeylessRefundRetryInsideTheWindowInOrderIsOneRefund: the same requests in the order of
// their times (R1 reaches the key first): one refund.
func TestAKeylessRefundRetryInsideTheWindowInOrderIsOneRefund(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-probe-renew-control", 1000)
	lag := payments.NewManualClock(t0)
	_, eB := b.server(t, b.pool, "replica-b", benchOpt{core: func(c *payments.Config) { c.Clock = lag }})
	refund := post(refundsPath(p.ID), `{"amount":100}`)
	b.clock.Set(t0.Add(10 * time.Minute))
	wantRefund(t, b.do(refund), http.StatusCreated)
	lag.Set(t0.Add(15*time.Minute - time.Second))
	b.clock.Set(t0.Add(15*time.Minute + 500*time.Millisecond))
	wantRefund(t, b.on(eB, refund), http.StatusCreated)
	wantRefund(t, b.do(refund), http.StatusCreated)
	if n, calls := b.refunds(t), b.gw.Calls(fakegw.OpRefund); n != 1 || calls != 1 {
		t.Fatalf("refunds = %d, gateway refund calls = %d; want 1 and 1", n, calls)
	}
}
