package payments_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The order's page retries its last payment without a link (the order's page token, which never
// expires) only while a link at the order's checkout price is valid: the latest expiry among
// the links made at that price, which a later link at the same price extends and never
// shortens, and a new price starts over. An order no link ever priced gets no page retry at all
// (the contract promises none; the shop decides), and a row from before migration 00560 counts
// as priced_at + the longest lifetime a link could have had.
// Negative control (run by hand): with CheckoutRetry answering nil for any priced order (no
// time), the retry is still open an hour after the one-hour link expired.
func TestCheckoutRetryIsHeldToTheLinks(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	retry := func(order string, amount int64) error { return b.svc.CheckoutRetry(ctx, order, amount, "EUR") }
	link := func(order string, amount int64, ttl time.Duration) {
		t.Helper()
		if _, err := b.svc.CheckoutLink(ctx, order, amount, "EUR", ttl); err != nil {
			t.Fatal(err)
		}
	}

	if err := retry("o-never-linked", 500); !errors.Is(err, payments.ErrNoCheckoutRetry) {
		t.Fatalf("an order no link priced: %v, want ErrNoCheckoutRetry", err)
	}

	link("o-retry", 500, time.Hour)
	link("o-retry", 500, 10*time.Minute) // a shorter link at the same price: the hour still holds
	if err := retry("o-retry", 500); err != nil {
		t.Fatalf("within the link's hour: %v", err)
	}
	if err := retry("o-retry", 499); !errors.Is(err, payments.ErrLinkReplaced) {
		t.Fatalf("another amount: %v, want ErrLinkReplaced", err)
	}
	b.clock.Advance(time.Hour - time.Second)
	if err := retry("o-retry", 500); err != nil {
		t.Fatalf("a second before the hour is up: %v", err)
	}
	b.clock.Advance(time.Second)
	if err := retry("o-retry", 500); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("the hour is up: %v, want EEXPIRED", err)
	}
	// The shop sends a new link at the same price: the page may retry again, for its lifetime.
	link("o-retry", 500, time.Minute)
	if err := retry("o-retry", 500); err != nil {
		t.Fatalf("after a new link: %v", err)
	}
	// A new price starts over with its own link's time, however long the old one had.
	link("o-reprice", 500, 30*24*time.Hour)
	link("o-reprice", 700, time.Minute)
	b.clock.Advance(time.Minute)
	if err := retry("o-reprice", 700); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("the new price's minute is up: %v, want EEXPIRED", err)
	}

	// A row written before valid_until existed (or by a replica of the release before).
	if _, err := b.pool.Exec(ctx, `INSERT INTO checkout_prices (order_id, amount, currency, priced_at) VALUES ('o-legacy', 500, 'EUR', $1)`,
		b.clock.Now()); err != nil {
		t.Fatal(err)
	}
	link("o-legacy", 500, time.Minute) // a new link at its price never shortens what the row allowed
	b.clock.Advance(payments.MaxCheckoutLinkTTL - time.Second)
	if err := retry("o-legacy", 500); err != nil {
		t.Fatalf("a legacy row within its 30 days: %v", err)
	}
	b.clock.Advance(time.Second)
	if err := retry("o-legacy", 500); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("a legacy row after its 30 days: %v, want EEXPIRED", err)
	}
}

// CheckoutReplay answers a repeat of a Pay click whose form can no longer start a payment: the
// click's session when it made one, busy while its first request runs, and ENOTFOUND — with
// nothing written and no gateway call — for a key that never ran, ran for another order or
// amount, or was let go without a session (no take-over, unlike CheckoutPay).
func TestCheckoutReplayStartsNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	in := payments.CreateInput{OrderID: "o-replay", Amount: 1999, Currency: "EUR"}
	if _, err := b.svc.CheckoutReplay(ctx, "6f1c1d5e-0d5e-4c4b-9d51-6f7a3d1c2b10", in); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("an unknown key: %v, want ENOTFOUND", err)
	}
	key := "0b9a8f7e-6d5c-4b3a-9281-706f5e4d3c2b"
	first, err := b.svc.CheckoutPay(ctx, key, in, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.svc.CheckoutReplay(ctx, key, in)
	if err != nil || !got.Replayed || got.Session.ID != first.Session.ID {
		t.Fatalf("a bound key: %+v %v, want a replay of %s", got, err, first.Session.ID)
	}
	other := in
	other.Amount = 1
	if _, err := b.svc.CheckoutReplay(ctx, key, other); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("the key with another amount: %v, want ENOTFOUND", err)
	}
	// In flight (held, no session): busy. Let go (or abandoned past its hold): nothing to replay.
	if _, err := b.pool.Exec(ctx, `UPDATE checkout_intents SET session_id = NULL, locked_until = $2 WHERE key = $1`,
		key, b.clock.Now().Add(payments.StaleAfterFor(0))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.CheckoutReplay(ctx, key, in); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("a key in flight: %v, want EBUSY", err)
	}
	b.clock.Advance(payments.StaleAfterFor(0))
	if _, err := b.svc.CheckoutReplay(ctx, key, in); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("a key abandoned past its hold: %v, want ENOTFOUND (no take-over)", err)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("%d registrations, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-replay'`); n != 1 {
		t.Fatalf("%d sessions, want 1", n)
	}
}
