package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// Code limits at their edges (an outside review, cancels).

// The fourth code request of the hour on a payment whose guess budget is spent answered the
// hour's Retry-After (when the first request leaves the hour), while the payment's codes stayed
// locked for most of a day: a client that waited as told was refused again. The longest wait
// answers (longestWait).
func TestTheFourthRequestOnALockedPaymentSaysWhenItCanAsk(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-code-ra", 1000)
	start := b.clock.Now()
	guess := func(n int) {
		t.Helper()
		ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		code := b.lastCode(t, sess.ID)
		for range n {
			if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, otherCode(code)); payments.ErrorCode(err) != payments.EWRONG {
				t.Fatalf("wrong guess = %v", err)
			}
			b.clock.Advance(time.Minute)
		}
	}
	guess(4)
	guess(4)
	guess(2) // the tenth wrong guess: codes locked until start+24h
	_, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("fourth request = %v, want locked", err)
	}
	ra := payments.RetryAfter(err)
	if want := start.Add(24 * time.Hour).Sub(start.Add(10 * time.Minute)); ra < want {
		t.Fatalf("Retry-After = %s (%v), but the payment's codes stay locked %s", ra, err, want)
	}
	// Wait as told, and ask again: the code is sent.
	b.clock.Advance(ra)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatalf("the request after waiting the Retry-After (%s): %v", ra, err)
	}
}

// The contract's "the same code again → 200": a confirm whose answer was lost, retried after a
// mistyped retry spent the payment's guess budget, was answered 429 — the shop told the customer
// a cancel that went through had failed.
func TestTheCancelingCodesRetryIsNotLockedOut(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-code-replay", 1000)
	// Nine mistyped codes over two codes (the customer reading it out badly).
	for _, n := range []int{5, 4} {
		ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		code := b.lastCode(t, sess.ID)
		for range n {
			if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, otherCode(code)); payments.ErrorCode(err) != payments.EWRONG {
				t.Fatalf("wrong guess = %v", err)
			}
		}
		b.clock.Advance(time.Minute)
	}
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	first, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code)
	if err != nil {
		t.Fatalf("the right code: %v", err)
	}
	// The shop's second submission, mistyped, arrives after it.
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, otherCode(code)); err == nil {
		t.Fatal("a wrong code was accepted")
	}
	// The shop never got the first answer (it hung up) and sends the right code again.
	again, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code)
	if err != nil || !again.Replayed {
		t.Fatalf("the same right code again = %+v %v; want the replay of %s (the payment is %s)", again, err, first.Session.Status, b.texts(t, `SELECT status FROM payment_sessions WHERE id = $1`, sess.ID))
	}
}
