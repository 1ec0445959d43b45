package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A Canceling session without its gateway id: the patrol's drive held a send (send_held_at)
// before its search by reference, and the search failed — nothing was sent. Flagged, finance's
// Retry waited RegisterGrace for a registration that never went out (a review of callInFlight's
// send_held_at). The drive holds right before what it sends. Negative control (run by hand): with
// the drive's hold before the look-up again, due RegisterGrace later.
func TestARetryWaitsForNoSendThatNeverWent(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	u := b.unregistered(t, "o-retry-nothing-sent", 1000)
	ch, err := b.svc.RequestCancel(ctx, api, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.Fail(fakegw.OpFind, fakegw.Transient, 100)
	if _, err := b.svc.ConfirmCancel(ctx, api, u.ID, ch.ID, b.lastCode(t, u.ID)); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(10 * time.Minute)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE id = $1 AND status = 'Canceling' AND gateway_payment_id IS NULL`, u.ID); n != 1 {
		t.Fatal("setup: not Canceling without its gateway id")
	}
	if n := b.count(t, `SELECT count(*) FROM gateway_calls WHERE session_id = $1 AND operation = 'register' AND created_at >= $2`, u.ID, b.clock.Now()); n != 0 {
		t.Fatalf("setup: the drive registered (%d)", n)
	}
	// The schedule ran out on this look (as the release flags it).
	b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'schedule ran out', next_check_at = NULL WHERE id = $1`, u.ID, b.clock.Now())
	got, err := b.svc.RetryFlagged(ctx, fin1, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.NextCheckAt == nil || got.NextCheckAt.After(b.clock.Now()) {
		t.Fatalf("Retry of a session nothing was sent for: due %v, now %v", got.NextCheckAt, b.clock.Now())
	}
}

// The other side of the same change: a Canceling session whose payment the drive finds by
// reference is held right before its reverse goes (the drive's hold moved from before the
// look-up into driveReverse), so a late send's guard and finance's Retry see it. Negative
// control (run by hand): without the hold after the look-up, no send held at the reverse.
func TestAReverseOfAPaymentFoundByReferenceIsHeld(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	r, err := b.plain.Create(ctx, api, payments.CreateInput{OrderID: "o-reverse-found", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil || r.Session.GatewayPaymentID != "" {
		t.Fatalf("setup: %+v %v, want no gateway id", r.Session, err)
	}
	ch, err := b.svc.RequestCancel(ctx, api, r.Session.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = b.svc.ConfirmCancel(ctx, api, r.Session.ID, ch.ID, b.lastCode(t, r.Session.ID))
	b.clock.Advance(10 * time.Minute)
	swept := b.clock.Now()
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM gateway_calls WHERE session_id = $1 AND operation = 'reverse' AND created_at >= $2`, r.Session.ID, swept); n != 1 {
		t.Fatalf("setup: %d reverses sent by the drive; calls %q; row %q", n,
			b.texts(t, `SELECT operation || ' ' || outcome || ' ' || created_at::text FROM gateway_calls WHERE session_id = $1 ORDER BY id`, r.Session.ID),
			b.texts(t, `SELECT status || ' ' || coalesce(next_check_at::text, '-') || ' ' || coalesce(gateway_payment_id, '-') FROM payment_sessions WHERE id = $1`, r.Session.ID))
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE id = $1 AND send_held_at >= $2`, r.Session.ID, swept); n != 1 {
		t.Fatal("the drive reversed a payment found by reference without holding the send")
	}
}
