package payments_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A Pay click's first request (A) is slower than the stale time: parked before it registers its
// session S1 at the gateway. Meanwhile the patrol finds S1 and the gateway refuses it (Failed),
// and a retry of the click (B) takes the key over, creates S2 (registered) and binds the key to
// it. When A resumes, its bind must not move the key back to S1: the key is B's now (another
// lock_token). A's answer is the key's: S2, a replay; every later retry of the click too.
// Negative control (run by hand): with the bind guarded by the key alone (the release before),
// the key ends bound to the failed S1 and A answers S1.
func TestCheckoutPaySlowClickDoesNotOverwriteTheRetrysSession(t *testing.T) {
	t.Parallel()
	var (
		once    sync.Once
		parked  = make(chan string, 1)
		resume  = make(chan struct{})
		resumed sync.Once
	)
	b := newBench(t, func(c *payments.Config) {
		c.Hooks.BeforeRegister = func(ctx context.Context, id string) {
			first := false
			once.Do(func() { first = true })
			if first { // only A's registration waits
				parked <- id
				<-resume
			}
		}
	})
	t.Cleanup(func() { resumed.Do(func() { close(resume) }) }) // before the pool closes, also when the test fails
	ctx := context.Background()
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "o-slow-bind", Amount: 1999, Currency: "EUR"}

	type result struct {
		res payments.CheckoutPayResult
		err error
	}
	slow := make(chan result, 1)
	go func() {
		res, err := b.svc.CheckoutPay(ctx, key, in, 0)
		slow <- result{res, err}
	}()
	s1 := mustWait(t, parked, "A before its registration")

	// Past the stale time (and the registration's grace): the patrol registers S1 and the
	// gateway refuses it.
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	if _, err := b.plain.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := b.svc.Get(ctx, s1); err != nil || got.Status != payments.StatusFailed {
		t.Fatalf("S1 after the patrol: %+v %v", got.Status, err)
	}
	// B: the same click again, A's hold stale: takes the key over, a new session S2.
	retry, err := b.svc.CheckoutPay(ctx, key, in, 0)
	if err != nil || retry.Session.ID == s1 || retry.Session.Status != payments.StatusRegistered {
		t.Fatalf("B: %+v %v, want a new registered session", retry.Session, err)
	}
	s2 := retry.Session.ID

	// A resumes; the gateway refuses its late registration of S1 too (as it did the patrol's).
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	resumed.Do(func() { close(resume) })
	got := mustWait(t, slow, "A")
	if got.err != nil || got.res.Session.ID != s2 {
		t.Fatalf("A answers %s (%v), want the key's session S2 %s", got.res.Session.ID, got.err, s2)
	}
	it, err := b.svc.GetCheckoutIntent(ctx, key)
	if err != nil || it.SessionID != s2 {
		t.Fatalf("the key is bound to %q (%v), want B's S2 %s (S1 is %s)", it.SessionID, err, s2, s1)
	}
	if again, err := b.svc.CheckoutPay(ctx, key, in, 0); err != nil || !again.Replayed || again.Session.ID != s2 {
		t.Fatalf("a later retry of the click: %+v %v, want a replay of S2", again.Session.ID, err)
	}
}

// A Pay click's first request (A) is parked in its claim past the stale time, holding the
// order's lock; a retry of the click (B) takes the key over and waits for that lock. A is then
// refused (the shop priced the order at another amount since: a newer link) and lets go of the key — which is
// B's now: A's release must not drop B's hold, or a third request of the click would get in
// beside B instead of waiting for it (EBUSY). After B ends (refused too) the key is free again.
// Negative control (run by hand): with the release guarded by the key alone (the release
// before), the key is not in flight while B runs, and a third request is not told to wait.
func TestCheckoutPaySlowClickDoesNotReleaseTheRetrysHold(t *testing.T) {
	t.Parallel()
	p := newParker()
	ctx := context.Background()
	var b *bench
	var once sync.Once
	b = newBench(t, func(c *payments.Config) {
		c.Hooks.AfterClaimRead = p.hook
		// A link for 5.00 made right after A's click wrote its key (the form for 19.99 was
		// rendered before): a click whose price is already replaced writes no key at all, nor
		// one on an order with an active payment (checkoutStartAllowed: startsNothing).
		c.Hooks.AfterIntentAcquire = func(context.Context, string) {
			once.Do(func() {
				if _, err := b.plain.CheckoutLink(ctx, "o-slow-release", 500, "EUR", time.Hour); err != nil {
					t.Error(err)
				}
			})
		}
	})
	t.Cleanup(func() { p.let(10) }) // before the pool closes, also when the test fails
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "o-slow-release", Amount: 1999, Currency: "EUR"}
	click := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := b.svc.CheckoutPay(ctx, key, in, 0)
			done <- err
		}()
		return done
	}

	a := click()
	mustWait(t, p.arrived, "A in its claim")
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	retry := click()
	waitLockWaiters(t, b.pool, 1) // B took the key over and waits for the order's lock A holds
	p.let(1)
	if err := mustWait(t, a, "A"); !errors.Is(err, payments.ErrLinkReplaced) {
		t.Fatalf("A: %v, want the newer link's refusal", err)
	}
	mustWait(t, p.arrived, "B in its claim")
	it, err := b.svc.GetCheckoutIntent(ctx, key)
	if err != nil || !it.InFlight(b.clock.Now()) {
		t.Fatalf("while B runs, the key is %+v (%v): A's release dropped B's hold", it, err)
	}
	if _, err := b.svc.CheckoutPay(ctx, key, in, 0); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("a third request while B runs: %v, want to be told to wait", err)
	}
	p.let(1)
	if err := mustWait(t, retry, "B"); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("B: %v", err)
	}
	if it, err := b.svc.GetCheckoutIntent(ctx, key); err != nil || it.InFlight(b.clock.Now()) || it.SessionID != "" {
		t.Fatalf("after B: the key is %+v (%v), want it let go", it, err)
	}
}

// An order's new Pay clicks are counted (payments.CheckoutStartsPerHour per hour), the same
// budget on every replica: with one start left, two replicas' new clicks wait for the order's
// lock at once (seen in pg_locks), and exactly one of them starts a payment; the other is
// ELOCKED with when the oldest click is an hour old. Repeats of counted clicks (replays) are
// answered whatever the budget and spend nothing; another order has its own budget.
// Negative control (run by hand): without the order's lock in checkoutStartAllowed, the two
// clicks never wait for it (waitLockWaiters fails): nothing serialises their counts.
func TestCheckoutStartsBudgetHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	other := b.service(testdb.Pool(t, b.url), "replica-b")
	ctx := context.Background()
	const order = "o-budget"
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, payments.CheckoutStartsPerHour+1)
	in := payments.CreateInput{OrderID: order, Amount: 700, Currency: "EUR"}
	var keys []string
	for range payments.CheckoutStartsPerHour - 1 {
		key := uuid.NewString()
		res, err := b.svc.CheckoutPay(ctx, key, in, 0)
		if err != nil || res.Session.Status != payments.StatusFailed {
			t.Fatalf("a refused registration: %+v %v", res.Session, err)
		}
		keys = append(keys, key)
		b.clock.Advance(time.Second)
	}

	holder, _ := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(payments.LockCreateOrder), order); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	for _, svc := range []*payments.Service{b.svc, other} {
		go func() {
			_, err := svc.CheckoutPay(ctx, uuid.NewString(), in, 0)
			done <- err
		}()
	}
	waitLockWaiters(t, b.pool, 2)
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var refused []error
	for range 2 {
		if err := mustWait(t, done, "a click"); err != nil {
			refused = append(refused, err)
		}
	}
	if len(refused) != 1 || payments.ErrorCode(refused[0]) != payments.ELOCKED {
		t.Fatalf("the last start raced by two replicas: refusals %v, want exactly one ELOCKED", refused)
	}
	if d := payments.RetryAfter(refused[0]); d != time.Hour-time.Duration(payments.CheckoutStartsPerHour-1)*time.Second {
		t.Fatalf("Retry-After %s, want when the first click is an hour old", d)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != payments.CheckoutStartsPerHour {
		t.Fatalf("%d registrations, want %d", n, payments.CheckoutStartsPerHour)
	}
	for _, key := range keys {
		if res, err := other.CheckoutPay(ctx, key, in, 0); err != nil || !res.Replayed {
			t.Fatalf("a repeat of a counted click: %+v %v, want its replay", res, err)
		}
	}
	if _, err := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: "o-budget-other", Amount: 700, Currency: "EUR"}, 0); err != nil {
		t.Fatalf("another order's click: %v", err)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != payments.CheckoutStartsPerHour+1 {
		t.Fatalf("%d registrations, want %d", n, payments.CheckoutStartsPerHour+1)
	}
}
