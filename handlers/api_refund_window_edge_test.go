package handlers_test

import (
	"net/http"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// TestAKeylessRefundRetryInsideTheWindowOvertakenByALaterOneIsOneRefund: a chain of identical
// keyless refunds, each within 5 minutes of the one before, is one refund (contract). The first
// at 10m; the shop's retry R1 at 14m59s reaches replica B, which reads its time and then waits (a
// pool connection; B's lagging clock stands in for the wait, as in
// TestKeylessRefundRetriedAtTheWindowsEdgeOutlivesTheReaper); the shop's client gives up on it
// and retries (R2) at 15m00.5s through replica A, which found the intent expired (not reaped),
// started a new use and refunded again; R1 then replayed R2's refund: two refunds for one chain
// (an outside review of clock-order decisions). An intent lives StaleAfter past its window for
// such a request.
func TestAKeylessRefundRetryInsideTheWindowOvertakenByALaterOneIsOneRefund(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-probe-renew-edge", 1000)
	lag := payments.NewManualClock(t0)
	_, eB := b.server(t, b.pool, "replica-b", benchOpt{core: func(c *payments.Config) { c.Clock = lag }})
	refund := post(refundsPath(p.ID), `{"amount":100}`)

	b.clock.Set(t0.Add(10 * time.Minute))
	first := wantRefund(t, b.do(refund), http.StatusCreated) // the intent expires at t0+15m
	// R1 read its time at 14m59s on replica B (inside the window) and is still waiting.
	lag.Set(t0.Add(15*time.Minute - time.Second))
	// R2, the client's retry of R1 1.5 s later, reaches replica A first.
	b.clock.Set(t0.Add(15*time.Minute + 500*time.Millisecond))
	r2 := wantRefund(t, b.do(refund), http.StatusCreated)
	// R1 arrives at the key.
	r1 := wantRefund(t, b.on(eB, refund), http.StatusCreated)
	t.Logf("first %s, R1 (14m59s) %s, R2 (15m00.5s) %s", first.ID, r1.ID, r2.ID)
	if n, calls := b.refunds(t), b.gw.Calls(fakegw.OpRefund); n != 1 || calls != 1 {
		t.Fatalf("a chain of identical keyless refunds at 10m, 14m59s and 15m00.5s (each within 5 minutes of the one before): refunds = %d, gateway refund calls = %d; want 1 and 1",
			n, calls)
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
