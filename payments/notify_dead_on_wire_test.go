package payments_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"pitlane/payments"
)

// gateNotifier holds its first message until released, then fails it; later ones go through.
type gateNotifier struct {
	mu      sync.Mutex
	calls   int
	entered chan struct{}
	release chan struct{}
}

func (n *gateNotifier) Notify(ctx context.Context, m payments.Message) error {
	n.mu.Lock()
	n.calls++
	first := n.calls == 1
	n.mu.Unlock()
	if !first {
		return nil
	}
	close(n.entered)
	<-n.release
	return errors.New("503 from the notifier")
}

// TestACodeThatDiesOnTheWireAndFailsStopsCountingAsFailing: the housekeeping marks a dead
// code's unsent message skipped (TestADeadCodeWhoseTriesFailedStopsCountingAsFailing). One whose
// code died while its POST was on the way (a live lease) only had its body redacted; when that
// POST then failed, RedactDeadCodes never looked at the row again (body = redacted_body) and it
// counted as failing until the claim's next try, up to 8 minutes later (a review of the rule).
func TestACodeThatDiesOnTheWireAndFailsStopsCountingAsFailing(t *testing.T) {
	t.Parallel()
	n := &gateNotifier{entered: make(chan struct{}), release: make(chan struct{})}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	sess := b.registered(t, "o-dead-on-wire", 100)
	type res struct {
		ch  payments.Challenge
		err error
	}
	done := make(chan res, 1)
	go func() {
		ch, err := b.svc.RequestCancel(ctx, api, sess.ID) // its POST is held
		done <- res{ch, err}
	}()
	<-n.entered
	// The customer asks again: a newer code, delivered; the first is superseded while its POST waits.
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	// The housekeeping runs while the first is on its way (lease live): redacted, not skipped.
	if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	close(n.release) // the first POST fails
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	// The next housekeeping round.
	if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	st, err := b.svc.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.FailingMessages != 0 {
		t.Errorf("failing messages after the superseded code's delivery failed and housekeeping ran again: %d, want 0 (skipped=%d)",
			st.FailingMessages, b.count(t, `SELECT count(*) FROM outbox WHERE challenge_id = $1 AND skipped_at IS NOT NULL`, r.ch.ID))
	}
}
