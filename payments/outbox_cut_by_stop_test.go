package payments_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"pitlane/payments"
)

// stopCutNotifier fails while down; while parking it announces each call and holds it until the
// caller's context ends (a delivery on the wire when the replica stops).
type stopCutNotifier struct {
	mu      sync.Mutex
	down    bool
	parking bool
	arrived chan struct{}
	got     []payments.Message
}

func (n *stopCutNotifier) Notify(ctx context.Context, m payments.Message) error {
	n.mu.Lock()
	down, parking := n.down, n.parking
	n.mu.Unlock()
	if parking {
		n.arrived <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	if down {
		return context.DeadlineExceeded
	}
	n.mu.Lock()
	n.got = append(n.got, m)
	n.mu.Unlock()
	return nil
}

// operations.md ("Stopping a replica") promises that drives cut by the patrol's stop are given
// back due now with their schedule untouched ("the cut look never happened"); the outbox is part
// of the patrol. A code message whose delivery was on the wire at SIGTERM was recorded as a
// failed attempt and pushed back on the retry schedule — and when it was the fifth try, it was
// never sent again. Outside review (crashes); fails without the give-back in deliver.
func TestOutboxDeliveryCutByShutdownKeepsItsSchedule(t *testing.T) {
	t.Parallel()
	n := &stopCutNotifier{down: true, arrived: make(chan struct{}, 4)}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n; c.CodeTTL = 2 * time.Hour })
	b.reconcileElsewhere(t)
	ctx := context.Background()
	sess := b.registered(t, "o-outbox-cut-by-stop", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil { // first try fails: attempts 1
		t.Fatal(err)
	}
	for range 3 { // the notifier endpoint stays down: attempts 2, 3, 4
		b.clock.Advance(10 * time.Minute)
		if _, err := b.svc.DeliverOutbox(ctx); err != nil {
			t.Fatal(err)
		}
	}
	attempts := func() int {
		return b.count(t, `SELECT attempts FROM outbox WHERE payment_id = $1 AND kind <> ''`, sess.ID)
	}
	if a := attempts(); a != 4 {
		t.Fatalf("setup: %d attempts, want 4", a)
	}

	// The endpoint is back but slow; the 5th try is on the wire when the replica is stopped.
	b.clock.Advance(10 * time.Minute)
	n.mu.Lock()
	n.down, n.parking = false, true
	n.mu.Unlock()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(rctx, time.Hour); close(done) }()
	mustWait(t, n.arrived, "the outbox delivery on the wire")
	cancel() // SIGTERM: the patrol stops
	mustWait(t, done, "the patrol to stop")

	n.mu.Lock()
	n.parking = false
	n.mu.Unlock()
	if a := attempts(); a != 4 {
		t.Errorf("the delivery cut by shutdown was counted as a failed attempt: %d attempts, want 4 (the cut look never happened)", a)
	}
	// Another replica's next round (or this one after its restart) sends the code.
	b.clock.Advance(time.Second)
	other := b.service(b.pool, "replica-b", func(c *payments.Config) { c.Notifier = n; c.CodeTTL = 2 * time.Hour })
	if _, err := other.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	got := len(n.got)
	n.mu.Unlock()
	if got != 1 {
		t.Fatalf("the customer's cancel code was delivered %d times after the restart, want 1 (undelivered=%d)", got,
			b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND delivered_at IS NULL AND skipped_at IS NULL`, sess.ID))
	}
}
