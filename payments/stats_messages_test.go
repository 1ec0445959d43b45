package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// Customer messages (one-time codes) whose delivery to the notifier failed are counted, with the
// oldest one's age (pitlane_customer_messages_failing and …_oldest_failing_seconds, the
// PitlaneCustomerMessagesFailing alert), until they are delivered; a message never tried (a
// service without NOTIFY_WEBHOOK_URL: the admin outbox is its delivery) is not. Nothing said so
// before: a notifier down kept every customer without codes and only /outbox showed it (an
// observability review's gap).
func TestStatsCountCustomerMessagesWhoseDeliveryFailed(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	stats := func() payments.Stats {
		t.Helper()
		st, err := b.svc.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	kept := b.registered(t, "o-msg-outbox-only", 100)
	if _, err := b.plain.RequestCancel(ctx, api, kept.ID); err != nil { // no notifier: kept for /outbox
		t.Fatal(err)
	}
	sess := b.registered(t, "o-msg-failing", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil { // the notifier is down
		t.Fatal(err)
	}
	b.clock.Advance(3 * time.Minute)
	if st := stats(); st.FailingMessages != 1 || st.OldestFailingMessage != 3*time.Minute {
		t.Fatalf("failing messages = %d, oldest %v; want 1 (the failed one, not the outbox-only one) and 3m0s",
			st.FailingMessages, st.OldestFailingMessage)
	}
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	if sent, err := b.svc.DeliverOutbox(ctx); err != nil || sent < 1 {
		t.Fatalf("retry delivered %d: %v", sent, err)
	}
	if st := stats(); st.FailingMessages != 0 || st.OldestFailingMessage != 0 {
		t.Fatalf("after delivery: failing messages = %d, oldest %v; want none", st.FailingMessages, st.OldestFailingMessage)
	}
}
