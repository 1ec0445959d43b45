package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A keyed Create whose first request A is slow before its claim (a starved pool:
// the request bound, 3×GATEWAY_TIMEOUT+25 s = 55 s, outlasts StaleAfter, 2×GATEWAY_TIMEOUT+10 s
// = 30 s) is taken over by the client's retry B. B claims session S, the gateway refuses its
// registration (a risk rule: S Failed), B completes the key with S. A then claims: the order has
// no active session, so A inserts S2 and registers it — its recordOnly binding matched no row
// (the key is no longer A's), and the claim goes on regardless. One Idempotency-Key, two
// sessions, two registrations at the gateway; the key replays S forever, S2 (live, payable) is
// known to no replay (an outside review). The gate in A's effect stands for the pool wait before
// the claim. A's claim reads whether it still holds its key (KeyBinding.queueHolds) and makes
// nothing when it does not. Negative control: without that read, two sessions.
func TestASlowCreateThatLostItsKeyMakesNoSecondSession(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	r := idemReq(cl.ID, "k-slow-create", `{"amount":100,"currency":"EUR"}`)
	in := payments.CreateInput{OrderID: "o-audit-slow-create", Amount: 100, Currency: "EUR"}
	effect := func(gate <-chan struct{}, entered chan<- struct{}) payments.Effect {
		return func(ctx context.Context, slot payments.Slot) (string, int, error) {
			if entered != nil {
				entered <- struct{}{}
			}
			if gate != nil {
				<-gate
			}
			in := in
			in.FirstAttempt, in.Bind = slot.Fresh, slot.Binding
			res, err := b.svc.Create(ctx, api, in)
			return res.Session.ID, 201, err
		}
	}

	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	type result struct {
		out payments.Outcome
		err error
	}
	aDone := make(chan result, 1)
	go func() {
		out, err := x.Run(ctx, r, effect(gate, entered))
		aDone <- result{out, err}
	}()
	mustWait(t, entered, "A holds the key, before its claim")

	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	bOut, err := x.Run(ctx, r, effect(nil, nil))
	if err != nil {
		t.Fatalf("B: %v", err)
	}

	close(gate)
	a := mustWait(t, aDone, "A") // an error is fine (the key is B's now); a second session is not

	replay, err := x.Run(ctx, r, effect(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*)::int FROM payment_sessions WHERE order_id = $1`, in.OrderID); n != 1 {
		t.Errorf("one Idempotency-Key made %d sessions (B: %s, A: %s; the key replays %s)", n, bOut.ResourceID, a.out.ResourceID, replay.ResourceID)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Errorf("one Idempotency-Key sent %d registrations to the gateway", n)
	}
	if a.err == nil && a.out.ResourceID != replay.ResourceID {
		t.Errorf("the first request answered session %s, the key's replay says %s", a.out.ResourceID, replay.ResourceID)
	}
}
