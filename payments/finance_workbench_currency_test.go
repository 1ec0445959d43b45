package payments_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"pitlane/payments"
)

// "amount, largest first" compared minor units across currencies: ¥3,000 (3000) sorted above
// €10.00 (1000) and €20.00 (2000), and a page boundary could fall between a currency's rows in
// any order. The workbench sorts each currency's amounts on their own, currencies
// alphabetically, and pages through that order by keyset. Outside review (money); fails with
// the order by raw amount.
func TestStuckByAmountSortsEachCurrencyOnItsOwn(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	eur10 := b.createIn(t, "o-eur-10", 1000, "EUR")
	jpy := b.createIn(t, "o-jpy-3000", 3000, "JPY")
	eur50 := b.createIn(t, "o-eur-50", 5000, "EUR")
	usd := b.createIn(t, "o-usd-3", 300, "USD")
	eur20 := b.createIn(t, "o-eur-20", 2000, "EUR")
	eur20b := b.createIn(t, "o-eur-20-b", 2000, "EUR") // a tie: by id
	b.clock.Advance(payments.SettleWithin + time.Minute)

	ties := []string{eur20.ID, eur20b.ID}
	slices.Sort(ties)
	want := []string{eur50.ID, ties[0], ties[1], eur10.ID, jpy.ID, usd.ID}
	p, err := b.svc.StuckSessions(ctx, payments.StuckFilter{Sort: payments.StuckByAmount})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(p.Sessions); !slices.Equal(got, want) {
		t.Fatalf("by amount = %v, want %v (EUR largest first, then JPY, then USD)", got, want)
	}
	for _, limit := range []int{1, 2, 4} {
		if got := stuckPages(t, b, payments.StuckFilter{Sort: payments.StuckByAmount, Limit: limit}); !slices.Equal(got, want) {
			t.Errorf("pages of %d = %v, want %v", limit, got, want)
		}
	}
	p, err = b.svc.StuckSessions(ctx, payments.StuckFilter{Sort: payments.StuckByAmount, Currency: "EUR", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	p, err = b.svc.StuckSessions(ctx, payments.StuckFilter{Sort: payments.StuckByAmount, Currency: "EUR", After: p.Next})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(p.Sessions); !slices.Equal(got, []string{ties[1], eur10.ID}) {
		t.Errorf("EUR page 2 = %v, want %v", got, []string{ties[1], eur10.ID})
	}
	// A cursor of the old order (amount_id) or of another shape is a clear error, not a page.
	for _, after := range []string{"1000_" + eur10.ID, "EUR_x_" + eur10.ID, "eu_1000_" + eur10.ID, "EUR_1000"} {
		if _, err := b.svc.StuckSessions(ctx, payments.StuckFilter{Sort: payments.StuckByAmount, After: after}); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("after %q: %v, want invalid", after, err)
		}
	}
}
