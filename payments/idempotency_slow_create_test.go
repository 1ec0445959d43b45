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
	sc := startSlowCreate(t, b, "o-slow-create", "k-slow-create")
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	bOut, err := sc.again()
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	a := sc.release(t) // an error is fine (the key is B's now); a second session is not
	replay, err := sc.again()
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*)::int FROM payment_sessions WHERE order_id = $1`, sc.in.OrderID); n != 1 {
		t.Errorf("one Idempotency-Key made %d sessions (B: %s, A: %s; the key replays %s)", n, bOut.ResourceID, a.out.ResourceID, replay.ResourceID)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Errorf("one Idempotency-Key sent %d registrations to the gateway", n)
	}
	if a.err == nil && a.out.ResourceID != replay.ResourceID {
		t.Errorf("the first request answered session %s, the key's replay says %s", a.out.ResourceID, replay.ResourceID)
	}
}

// A review of the change above: queueHolds read `lock_token = $4 AND completed_at IS NULL` into a
// bool. A key given up by a refused takeover (giveUp: !Fresh → Abandon) has lock_token NULL and
// no completion: the read was NULL, its Scan failed, and the slow first request's claim failed
// with an internal error (500) where the order's state answers 409 (another active payment).
// Negative control: the read without coalesce.
func TestASlowCreateAfterARefusedTakeoverIsNotInternal(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sc := startSlowCreate(t, b, "o-slow-refused", "k-slow-refused")
	// Meanwhile the shop's other path starts a payment of another amount for the order.
	if _, err := b.plain.Create(context.Background(), api, payments.CreateInput{OrderID: sc.in.OrderID, Amount: 250, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	if _, err := sc.again(); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("setup: B = %v, want a conflict", err)
	}
	a := sc.release(t)
	if code := payments.ErrorCode(a.err); code == payments.EINTERNAL {
		t.Errorf("the slow first request's claim after a refused takeover: %v (code %s), want a 409", a.err, code)
	}
}

// slowCreate is a keyed Create of 100 EUR whose first request A holds its key and waits before its
// claim (the gate stands for a pool wait) until released; the same request sent again runs at once.
type slowCreate struct {
	b    *bench
	x    *payments.Idempotency
	r    payments.IdempotencyRequest
	in   payments.CreateInput
	gate chan struct{}
	done chan slowResult
}

type slowResult struct {
	out payments.Outcome
	err error
}

// startSlowCreate starts A and returns once it holds the key, before its claim.
func startSlowCreate(t *testing.T, b *bench, order, key string) *slowCreate {
	t.Helper()
	cl := newClient(t, b, "shop")
	sc := &slowCreate{b: b, x: payments.NewIdempotency(b.svc, payments.IdempotencyConfig{}),
		r:    idemReq(cl.ID, key, `{"amount":100,"currency":"EUR"}`),
		in:   payments.CreateInput{OrderID: order, Amount: 100, Currency: "EUR"},
		gate: make(chan struct{}), done: make(chan slowResult, 1)}
	entered := make(chan struct{}, 1)
	go func() {
		out, err := sc.x.Run(context.Background(), sc.r, sc.effect(entered))
		sc.done <- slowResult{out, err}
	}()
	mustWait(t, entered, "A holds the key, before its claim")
	return sc
}

// effect is the request's Create; with entered set, it says so and waits for the gate first.
func (sc *slowCreate) effect(entered chan<- struct{}) payments.Effect {
	return func(ctx context.Context, slot payments.Slot) (string, int, error) {
		if entered != nil {
			entered <- struct{}{}
			<-sc.gate
		}
		in := sc.in
		in.FirstAttempt, in.Bind = slot.Fresh, slot.Binding
		res, err := sc.b.svc.Create(ctx, api, in)
		return res.Session.ID, 201, err
	}
}

// again sends the same request, at once.
func (sc *slowCreate) again() (payments.Outcome, error) {
	return sc.x.Run(context.Background(), sc.r, sc.effect(nil))
}

// release lets A go on and returns its outcome.
func (sc *slowCreate) release(t *testing.T) slowResult {
	t.Helper()
	close(sc.gate)
	return mustWait(t, sc.done, "A")
}
