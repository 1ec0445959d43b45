package payments_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"pitlane/payments"
)

// TestARefundCodeWithNoRoomStopsCountingAsFailing: a refund code whose delivery failed, and whose
// refund the shop's API then took the room of (refunded in full), is dead by the outbox claim's
// rule ('no_room': skipped, its challenge superseded). The housekeeping (RedactDeadCodes) did not
// know that reason: it left the message counted among failing customer messages and its code in
// clear until the next try (an outside review, chaos3). The two share deadCodeSQL now.
func TestARefundCodeWithNoRoomStopsCountingAsFailing(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	paid := b.completed(t, "o-chaos3-no-room", 1000)
	ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, uuid.NewString()))
	if err != nil || ch.Undelivered == "" {
		t.Fatalf("setup: %+v %v, want a code whose delivery failed", ch, err)
	}
	code := b.lastCode(t, paid.ID)
	// The shop refunds the payment in full through the API: the code's 7.00 no longer fits.
	if r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: paid.ID, Amount: 1000, RequestKey: "shop"}); err != nil || r.Refund.Status != payments.RefundSucceeded {
		t.Fatalf("shop refund: %+v %v", r.Refund, err)
	}
	// The housekeeping runs (its next try is still a minute away).
	if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	st, err := b.svc.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	clear := b.count(t, `SELECT count(*) FROM outbox WHERE challenge_id = $1 AND body LIKE '%' || $2 || '%'`, ch.ID, code)
	if st.FailingMessages != 0 || clear != 0 {
		t.Errorf("after housekeeping, a refund code with no room left still counts as failing (failing messages %d) and its code is in clear in %d message(s)", st.FailingMessages, clear)
	}
	if got := b.count(t, `SELECT count(*) FROM cancel_challenges WHERE id = $1 AND superseded_at IS NOT NULL`, ch.ID); got != 1 {
		t.Error("the dead refund code's challenge is still open: the form sent again once room came back would answer it as sent")
	}
	// Its next try sends nothing: the message is skipped, 'no_room'.
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	b.clock.Advance(2 * 60e9)
	if sent, err := b.svc.DeliverOutbox(ctx); sent != 0 || err != nil {
		t.Fatalf("retry sent %d (%v)", sent, err)
	}
	if got := b.count(t, `SELECT count(*) FROM outbox WHERE challenge_id = $1 AND skip_reason = 'no_room'`, ch.ID); got != 1 {
		t.Fatalf("the claim did not mark it no_room (%d)", got)
	}
}
