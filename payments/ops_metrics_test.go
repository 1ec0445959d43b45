package payments_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"pitlane/payments"
)

// TestStatsStuckMoneyByCurrency: Stats.Stuck sums the finance workbench's stuck sessions (active
// past SettleWithin, flagged or not) per currency, the most sessions first; sessions younger
// than that or settled are not stuck; beyond MaxStuckCurrencies currencies the rest is one
// "other" entry, so the metric labelled by currency stays bounded. Without the count, Stuck is
// empty. The bound ranks by sessions, not by amount: minor units of two currencies do not
// compare, and by amount a currency with three stuck sessions of small minor units folded into
// "other" behind one-session currencies of large ones (outside review, money).
func TestStatsStuckMoneyByCurrency(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	create := func(order string, amount int64, currency string) payments.Session {
		t.Helper()
		res, err := b.plain.Create(ctx, api, payments.CreateInput{OrderID: order, Amount: amount, Currency: currency})
		if err != nil {
			t.Fatal(err)
		}
		return res.Session
	}
	create("eur-1", 1000, "EUR")
	create("eur-2", 250, "EUR")
	create("usd-1", 5000, "USD")
	paid := create("eur-paid", 9999, "EUR")
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.plain.Check(ctx, api, paid.ID); err != nil {
		t.Fatal(err)
	}
	// 22 more currencies, one session each (XAA 10 … XCB 31), and XAA two more of one minor
	// unit: the most stuck sessions of all, among the smallest amounts (by amount it was "other").
	for i := range 22 {
		create(fmt.Sprintf("x-%d", i), int64(10+i), fmt.Sprintf("X%c%c", 'A'+i/10, 'A'+i%10))
	}
	create("xaa-2", 1, "XAA")
	create("xaa-3", 1, "XAA")
	b.clock.Advance(payments.SettleWithin + time.Second)
	create("eur-young", 777, "EUR") // not stuck yet

	st, err := b.svc.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Stuck) != payments.MaxStuckCurrencies+1 {
		t.Fatalf("%d stuck entries, want %d (+ other): %+v", len(st.Stuck), payments.MaxStuckCurrencies, st.Stuck)
	}
	if got := st.Stuck[0]; got != (payments.StuckMoney{Currency: "XAA", Sessions: 3, Amount: 10 + 1 + 1}) {
		t.Errorf("first = %+v, want XAA's three sessions", got)
	}
	if got := st.Stuck[1]; got != (payments.StuckMoney{Currency: "EUR", Sessions: 2, Amount: 1250}) {
		t.Errorf("EUR = %+v, want the two stuck EUR sessions (not the paid one, not the young one)", got)
	}
	if got := st.Stuck[2]; got != (payments.StuckMoney{Currency: "USD", Sessions: 1, Amount: 5000}) {
		t.Errorf("third = %+v, want USD (one session; ties by currency)", got)
	}
	// 24 currencies: 20 named, the last 4 of the one-session ones by name (XBI 28, XBJ 29,
	// XCA 30, XCB 31) are "other".
	if got := st.Stuck[payments.MaxStuckCurrencies]; got != (payments.StuckMoney{Currency: payments.StuckOtherCurrencies, Sessions: 4, Amount: 28 + 29 + 30 + 31}) {
		t.Errorf("other = %+v", got)
	}
	cached, err := b.svc.CachedStats(ctx, time.Second)
	if err != nil || len(cached.Stuck) != len(st.Stuck) || cached.Stuck[1] != st.Stuck[1] {
		t.Fatalf("cached stats carry the stuck money: %+v %v", cached.Stuck, err)
	}
}

// TestIdempotencyConflictsAreReported: OnConflict hears of every request refused because of its
// key — the key's first request still in flight (409) and a key reused for another request
// (422) — and of nothing else: not a replay, not a keyless Create that joins its twin
// (BusyRunsEffect), not a malformed key.
func TestIdempotencyConflictsAreReported(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	var mu sync.Mutex
	heard := map[string]int{}
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{OnConflict: func(kind payments.IdempotencyKind, reason string) {
		mu.Lock()
		heard[string(kind)+"/"+reason]++
		mu.Unlock()
	}})
	ctx := context.Background()
	r := idemReq(cl.ID, "k1", `{"amount":1}`)
	slot, err := x.Acquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Acquire(ctx, r); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("same key in flight = %v, want EBUSY", err)
	}
	if _, err := x.Acquire(ctx, idemReq(cl.ID, "k1", `{"amount":2}`)); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("reused key = %v, want EINVALID", err)
	}
	if err := x.Complete(ctx, r, slot.Token, "00000000-0000-0000-0000-000000000001", 201); err != nil {
		t.Fatal(err)
	}
	if s, err := x.Acquire(ctx, r); err != nil || !s.Done {
		t.Fatalf("replay = %+v %v", s, err)
	}
	if _, err := x.Acquire(ctx, idemReq(cl.ID, "", `{}`)); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("empty key = %v", err)
	}
	intent := idemReq(cl.ID, "intent-1", `{}`)
	intent.Kind, intent.BusyRunsEffect = payments.IdempotencyIntentKey, true
	if _, err := x.Acquire(ctx, intent); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Run(ctx, intent, func(context.Context, payments.Slot) (string, int, error) {
		return "00000000-0000-0000-0000-000000000002", 200, nil
	}); err != nil {
		t.Fatalf("keyless twin = %v, want it run", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"key/" + payments.ConflictInProgress: 1, "key/" + payments.ConflictReused: 1}
	if fmt.Sprint(heard) != fmt.Sprint(want) {
		t.Fatalf("heard %v, want %v", heard, want)
	}
}
