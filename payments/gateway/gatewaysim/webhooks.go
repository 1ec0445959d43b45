package gatewaysim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"pitlane/payments/gateway/webhooksig"
)

// WebhookFaults shape how events reach the receiver. The contract promises only "at least once,
// possibly duplicated, possibly out of order, possibly late"; these make each of those happen.
type WebhookFaults struct {
	// Duplicate sends every event this many extra times (same event id, same body).
	Duplicate int
	// Delay holds every event this long (wall clock) before its first attempt.
	Delay time.Duration
	// Reorder holds a payment's events until it reaches a final status, then sends them newest
	// first: "succeeded" arrives before "authorized".
	Reorder bool
}

// Delivery is one attempt to deliver one copy of an event.
type Delivery struct {
	EventID    string    `json:"event_id"`
	PaymentID  string    `json:"payment_id"`
	Status     string    `json:"status"` // the payment status the event carries
	Attempt    int       `json:"attempt"`
	HTTPStatus int       `json:"http_status,omitempty"`
	Error      string    `json:"error,omitempty"`
	At         time.Time `json:"at"`
}

// maxDeliveryLog bounds the delivery log.
const maxDeliveryLog = 1000

type event struct {
	id        string
	paymentID string
	status    string
	body      []byte
}

func newEvent(p Payment, now time.Time) *event {
	id := newID("evt_")
	body, _ := json.Marshal(struct {
		ID      string      `json:"id"`
		Type    string      `json:"type"`
		Created int64       `json:"created"`
		Data    paymentJSON `json:"data"`
	}{id, "payment.updated", now.Unix(), toJSON(p)})
	return &event{id: id, paymentID: p.ID, status: p.Status, body: body}
}

type delivery struct {
	ev      *event
	due     time.Time
	seq     int64
	attempt int // attempts made so far
}

// webhooks is the sender: one goroutine takes due deliveries in (due, seq) order, so without
// faults events arrive in the order they happened; failures are retried with backoff.
// Scheduling runs on the wall clock (it is transport, not a business rule); signatures carry
// the simulator's clock, so a receiver under test sharing that clock accepts them.
type webhooks struct {
	url      string
	secret   []byte
	client   *http.Client
	attempts int
	backoff  time.Duration
	timeout  time.Duration
	now      func() time.Time
	log      *slog.Logger
	ctx      context.Context
	cancel   context.CancelFunc

	mu         sync.Mutex
	faults     WebhookFaults
	queue      []*delivery
	held       map[string][]*event // Reorder: by payment id, in order of occurrence
	inflight   int
	seq        int64
	deliveries []Delivery
	wake       chan struct{} // capacity 1: "the queue changed"
	changed    chan struct{} // closed and replaced after every attempt and enqueue
}

func newWebhooks(opts Options, log *slog.Logger) *webhooks {
	w := &webhooks{
		url:      opts.WebhookURL,
		secret:   []byte(opts.WebhookSecret),
		client:   opts.WebhookClient,
		attempts: opts.WebhookAttempts,
		backoff:  opts.WebhookBackoff,
		timeout:  opts.WebhookTimeout,
		now:      opts.Now,
		log:      log,
		held:     map[string][]*event{},
		wake:     make(chan struct{}, 1),
		changed:  make(chan struct{}),
	}
	if w.client == nil {
		w.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if w.attempts <= 0 {
		w.attempts = 5
	}
	if w.backoff <= 0 {
		w.backoff = 500 * time.Millisecond
	}
	if w.timeout <= 0 {
		w.timeout = 10 * time.Second
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w
}

// enqueue is called with the simulator's lock held (lock order: Sim.mu → webhooks.mu).
func (w *webhooks) enqueue(ev *event, final bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.faults.Reorder {
		w.held[ev.paymentID] = append(w.held[ev.paymentID], ev)
		if final {
			w.releaseHeldLocked(ev.paymentID)
		}
		return
	}
	w.pushLocked(ev)
}

func (w *webhooks) releaseHeldLocked(paymentID string) {
	evs := w.held[paymentID]
	delete(w.held, paymentID)
	for i := len(evs) - 1; i >= 0; i-- {
		w.pushLocked(evs[i])
	}
}

func (w *webhooks) pushLocked(ev *event) {
	due := time.Now().Add(w.faults.Delay)
	for range 1 + max(0, w.faults.Duplicate) {
		w.seq++
		w.queue = append(w.queue, &delivery{ev: ev, due: due, seq: w.seq})
	}
	w.signalLocked()
}

func (w *webhooks) signalLocked() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// nextLocked removes and returns the first due delivery, or says how long until one is due
// (0 and nil: nothing queued).
func (w *webhooks) nextLocked(now time.Time) (*delivery, time.Duration) {
	best := -1
	for i, d := range w.queue {
		if best < 0 || d.due.Before(w.queue[best].due) || (d.due.Equal(w.queue[best].due) && d.seq < w.queue[best].seq) {
			best = i
		}
	}
	if best < 0 {
		return nil, 0
	}
	d := w.queue[best]
	if wait := d.due.Sub(now); wait > 0 {
		return nil, wait
	}
	w.queue = append(w.queue[:best], w.queue[best+1:]...)
	return d, 0
}

func (w *webhooks) run() {
	for w.ctx.Err() == nil {
		w.mu.Lock()
		d, wait := w.nextLocked(time.Now())
		if d == nil {
			w.mu.Unlock()
			var timer *time.Timer
			var fire <-chan time.Time
			if wait > 0 {
				timer = time.NewTimer(wait)
				fire = timer.C
			}
			select {
			case <-w.ctx.Done():
			case <-w.wake:
			case <-fire:
			}
			if timer != nil {
				timer.Stop()
			}
			continue
		}
		w.inflight++
		w.mu.Unlock()

		d.attempt++
		status, err := w.send(d.ev)

		w.mu.Lock()
		w.inflight--
		rec := Delivery{EventID: d.ev.id, PaymentID: d.ev.paymentID, Status: d.ev.status, Attempt: d.attempt, HTTPStatus: status, At: time.Now()}
		if err != nil {
			rec.Error = err.Error()
			if d.attempt < w.attempts && w.ctx.Err() == nil {
				wait := min(w.backoff<<(d.attempt-1), time.Minute)
				w.seq++
				d.due, d.seq = time.Now().Add(wait), w.seq
				w.queue = append(w.queue, d)
			}
			w.log.Warn("gatewaysim: webhook delivery failed", "event", d.ev.id, "attempt", d.attempt, "err", err)
		}
		w.deliveries = append(w.deliveries, rec)
		if len(w.deliveries) > maxDeliveryLog {
			w.deliveries = append(w.deliveries[:0:0], w.deliveries[len(w.deliveries)-maxDeliveryLog:]...)
		}
		w.signalLocked()
		w.mu.Unlock()
	}
}

// send makes one attempt; a non-2xx answer is an error.
func (w *webhooks) send(ev *event) (int, error) {
	ctx, cancel := context.WithTimeout(w.ctx, w.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(ev.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "pitlane-gatewaysim")
	req.Header.Set(webhooksig.Header, webhooksig.Sign(w.secret, w.now(), ev.body))
	resp, err := w.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("receiver answered %s", resp.Status)
	}
	return resp.StatusCode, nil
}

func (w *webhooks) stop() { w.cancel() }

func (w *webhooks) reset() {
	w.mu.Lock()
	w.faults = WebhookFaults{}
	w.queue = nil
	w.held = map[string][]*event{}
	w.deliveries = nil
	w.signalLocked()
	w.mu.Unlock()
}

func (w *webhooks) setFaults(f WebhookFaults) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wasReorder := w.faults.Reorder
	w.faults = f
	if wasReorder && !f.Reorder {
		w.flushHeldLocked()
	}
}

func (w *webhooks) flushHeldLocked() {
	for id := range w.held {
		w.releaseHeldLocked(id)
	}
}

func (w *webhooks) idle() bool { return len(w.queue) == 0 && w.inflight == 0 }

// waitIdle blocks until nothing is queued or in flight (held events do not count).
func (w *webhooks) waitIdle(ctx context.Context) error {
	for {
		w.mu.Lock()
		if w.idle() {
			w.mu.Unlock()
			return nil
		}
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ---- the Sim's webhook controls ----

// SetWebhookFaults replaces the webhook faults. Turning Reorder off sends what it held.
func (s *Sim) SetWebhookFaults(f WebhookFaults) {
	if s.wh != nil {
		s.wh.setFaults(f)
	}
}

// WebhookFaults returns the current webhook faults.
func (s *Sim) WebhookFaults() WebhookFaults {
	if s.wh == nil {
		return WebhookFaults{}
	}
	s.wh.mu.Lock()
	defer s.wh.mu.Unlock()
	return s.wh.faults
}

// FlushHeldWebhooks sends every event Reorder is holding (newest first per payment).
func (s *Sim) FlushHeldWebhooks() {
	if s.wh == nil {
		return
	}
	s.wh.mu.Lock()
	s.wh.flushHeldLocked()
	s.wh.mu.Unlock()
}

// WebhooksIdle blocks until no event is queued, scheduled for retry or in flight. Events held
// by Reorder do not count. Without a WebhookURL it returns at once.
func (s *Sim) WebhooksIdle(ctx context.Context) error {
	if s.wh == nil {
		return nil
	}
	return s.wh.waitIdle(ctx)
}

// Deliveries returns the last delivery attempts, oldest first.
func (s *Sim) Deliveries() []Delivery {
	if s.wh == nil {
		return nil
	}
	s.wh.mu.Lock()
	defer s.wh.mu.Unlock()
	return append([]Delivery(nil), s.wh.deliveries...)
}
