package payments_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
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

func (n *stopCutNotifier) set(down, parking bool) {
	n.mu.Lock()
	n.down, n.parking = down, parking
	n.mu.Unlock()
}

// newCodeBench: a bench whose service (and every replica built with mod) delivers through n,
// and a Registered payment of order whose cancel code the test asks for.
func newCodeBench(t *testing.T, n *stopCutNotifier, order string) (*bench, func(*payments.Config), payments.Session) {
	t.Helper()
	mod := func(c *payments.Config) { c.Notifier = n; c.CodeTTL = 2 * time.Hour }
	b := newBench(t, mod)
	b.reconcileElsewhere(t)
	return b, mod, b.registered(t, order, 100)
}

func (n *stopCutNotifier) delivered() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.got)
}

// operations.md ("Stopping a replica") promises that drives cut by the patrol's stop are given
// back due now with their schedule untouched; the outbox is part of the patrol. A code message on
// the wire at SIGTERM was recorded as a failed try and pushed back on the schedule — and as the
// fifth try it was never sent again. Outside review (crashes); fails without the give-back in
// deliver.
func TestOutboxDeliveryCutByShutdownKeepsItsSchedule(t *testing.T) {
	t.Parallel()
	n := &stopCutNotifier{down: true, arrived: make(chan struct{}, 4)}
	b, mod, sess := newCodeBench(t, n, "o-outbox-cut-by-stop")
	ctx := context.Background()
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil { // the first try fails: attempts 1
		t.Fatal(err)
	}
	for range 3 { // the notifier stays down: attempts 2, 3, 4
		b.clock.Advance(10 * time.Minute)
		if _, err := b.svc.DeliverOutbox(ctx); err != nil {
			t.Fatal(err)
		}
	}
	attempts := func() int {
		return b.count(t, `SELECT attempts FROM outbox WHERE payment_id = $1`, sess.ID)
	}
	if a := attempts(); a != 4 {
		t.Fatalf("setup: %d attempts, want 4", a)
	}

	// The endpoint is back but slow; the fifth try is on the wire when the replica is stopped.
	b.clock.Advance(10 * time.Minute)
	n.set(false, true)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(rctx, time.Hour); close(done) }()
	mustWait(t, n.arrived, "the outbox delivery on the wire")
	cancel() // SIGTERM: the patrol stops
	mustWait(t, done, "the patrol to stop")
	n.set(false, false)

	if a := attempts(); a != 4 {
		t.Errorf("the delivery cut by the stop was counted as a failed try: %d attempts, want 4", a)
	}
	// Another replica's next round (or this one after its restart) sends the code, once.
	b.clock.Advance(time.Second)
	other := b.service(b.pool, "replica-b", mod)
	if _, err := other.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.delivered(); got != 1 {
		t.Fatalf("the cancel code was delivered %d times after the stop, want 1", got)
	}
}

// A request that writes a code delivers it itself; when the request ends mid-delivery (the staff
// member's browser went away, a stop past the shutdown grace) the cut try is not counted either,
// and the patrol sends the message.
func TestOutboxDeliveryCutByItsRequestsEndIsNotATry(t *testing.T) {
	t.Parallel()
	n := &stopCutNotifier{parking: true, arrived: make(chan struct{}, 4)}
	b, _, sess := newCodeBench(t, n, "o-outbox-cut-by-request")
	ctx := context.Background()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := b.svc.RequestCancel(rctx, api, sess.ID); done <- err }()
	mustWait(t, n.arrived, "the request's delivery on the wire")
	cancel()
	if err := mustWait(t, done, "the request to end"); err != nil {
		t.Fatalf("RequestCancel: %v (the code was issued; only its delivery was cut)", err)
	}
	n.set(false, false)
	var attempts, leased int
	if err := b.pool.QueryRow(ctx, `SELECT attempts, (lease_until IS NOT NULL)::int FROM outbox WHERE payment_id = $1`, sess.ID).
		Scan(&attempts, &leased); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || leased != 0 {
		t.Errorf("after the cut: attempts=%d leased=%d, want 0 and 0 (given back, not a try)", attempts, leased)
	}
	b.clock.Advance(time.Hour) // past RegisterGrace: the patrol's
	if _, err := b.svc.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.delivered(); got != 1 {
		t.Fatalf("the cancel code was delivered %d times, want 1", got)
	}
}

// slowEndpointNotifier takes every message (the customer gets it) but answers slower than the
// caller waits: the call returns when the caller's context ends, as net/http's client does when
// its request's deadline passes.
type slowEndpointNotifier struct {
	mu  sync.Mutex
	got []payments.Message
}

func (n *slowEndpointNotifier) Notify(ctx context.Context, m payments.Message) error {
	n.mu.Lock()
	n.got = append(n.got, m)
	n.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (n *slowEndpointNotifier) calls() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.got)
}

// The negative side of the give-back: a drive's context also ends at its own deadline (one
// gateway timeout before its lease), and a notifier slower than that is a failed try, not a stop —
// or every round sends the same code again, attempts stay 0, no error reaches the outbox and the
// five-try bound never applies (an outside review found exactly that in the first give-back,
// which took any ended context for a stop).
func TestOutboxSlowNotifierIsAFailedTryNotAStop(t *testing.T) {
	t.Parallel()
	n := &slowEndpointNotifier{}
	b := newBench(t, func(c *payments.Config) {
		c.Notifier = n
		c.GatewayTimeout = 200 * time.Millisecond // lease 1.2 s, drive budget 1 s
		c.CodeTTL = 24 * time.Hour
	})
	b.reconcileElsewhere(t)
	ctx := context.Background()
	sess := b.registered(t, "o-slow-endpoint", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	for range 7 { // far enough apart for any step of the schedule (1, 2, 4, 8 … minutes)
		b.clock.Advance(time.Hour)
		if _, err := b.svc.DeliverOutbox(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var attempts int
	var lastErr *string
	if err := b.pool.QueryRow(ctx, `SELECT attempts, last_error FROM outbox WHERE payment_id = $1`, sess.ID).Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if got := n.calls(); got > 5 {
		t.Errorf("the same code was sent %d times (at most 5 tries); attempts=%d", got, attempts)
	}
	if attempts != n.calls() || lastErr == nil {
		t.Errorf("tries that ran out of time were not recorded as failures: %d calls, attempts=%d, last_error=%v", n.calls(), attempts, lastErr)
	}
}

// The patrol's retry of a webhook event whose apply failed is a drive too: cut by the stop, it
// went on the record as a failed apply (attempts + 1, "context canceled", the next try up to
// five minutes away) and another replica's next round found nothing to do. Outside review
// (crashes).
func TestWebhookRetryCutByShutdownKeepsItsSchedule(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	sess := b.registered(t, "o-webhook-cut", 500)
	// Only the event's retry talks to the gateway in the rounds below.
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET next_check_at = $2 WHERE id = $1`, sess.ID, t0.Add(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	res, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-cut", Type: "payment.updated",
		PaymentID: sess.GatewayPaymentID, Reference: sess.Reference()})
	if err != nil || res.Outcome != payments.EventQueued {
		t.Fatalf("delivery = %v %v, want queued", res.Outcome, err)
	}
	b.clock.Advance(time.Minute) // the retry is due
	state := func() (int, time.Time) {
		var a int
		var at time.Time
		if err := b.pool.QueryRow(ctx, `SELECT attempts, retry_at FROM webhook_events WHERE event_id = 'evt-cut'`).Scan(&a, &at); err != nil {
			t.Fatal(err)
		}
		return a, at
	}
	before, _ := state()

	gate := b.gw.Hold(fakegw.OpStatus)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(rctx, time.Hour); close(done) }()
	mustWait(t, gate.Arrived(), "the retry's status read")
	cancel() // SIGTERM
	mustWait(t, done, "the patrol to stop")
	b.gw.Unhold(fakegw.OpStatus)
	gate.Open()

	after, retryAt := state()
	if now := b.clock.Now(); after != before || retryAt.After(now) {
		t.Errorf("the retry cut by the stop was recorded as a failed apply: attempts %d -> %d, next try in %s (want due now, schedule untouched)",
			before, after, retryAt.Sub(now))
	}
	other := b.service(b.pool, "replica-b")
	if n, err := other.RetryWebhooksOnce(ctx); err != nil || n != 1 {
		t.Errorf("replica-b's next round applied %d events (%v), want the cut one at once", n, err)
	}
	if got := b.count(t, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt-cut' AND processed_at IS NOT NULL`); got != 1 {
		t.Errorf("the event is not processed after replica-b's round")
	}
}
