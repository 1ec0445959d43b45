// Package gatewaysim is a fault-injecting simulator of the reference gateway API
// (shared/contracts/gateway-api.md). `pitlane gatewaysim` serves it on a port (Main), `pitlane dev`
// mounts it in-process, and tests drive it through Go methods or its /_sim control API.
//
// It is a simulator, not pitlane: all state lives in memory behind one mutex, and nothing here is
// meant to survive a restart or to scale. What it must get right is the contract's observable
// behaviour (idempotency keys, reverse and refund rules, the hosted page, signed webhooks) and
// the faults real gateways show: latency, 5xx before processing, an answer lost after the work
// was done, a call stuck in flight, keys that are ignored.
//
// Time rules (capture after approval, expiry of untouched payments) read the injected clock
// (Options.Now) lazily: a payment is brought up to date whenever it is read or touched, and Tick
// brings every payment up to date (and so sends the webhooks of what changed). Main runs Tick on
// a ticker; tests move their clock and call Tick or just read.
package gatewaysim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Op names one operation of the API, for faults, pauses and call counts.
type Op string

// The operations of the contract.
const (
	OpRegister     Op = "register"      // POST /v1/payments
	OpStatus       Op = "status"        // GET /v1/payments/{id}
	OpFind         Op = "find"          // GET /v1/payments?reference=
	OpReverse      Op = "reverse"       // POST /v1/payments/{id}/reverse
	OpRefund       Op = "refund"        // POST /v1/payments/{id}/refunds
	OpRefundStatus Op = "refund_status" // GET /v1/refunds/{id}
)

// Ops lists every operation.
var Ops = []Op{OpRegister, OpStatus, OpFind, OpReverse, OpRefund, OpRefundStatus}

func validOp(op Op) bool {
	for _, o := range Ops {
		if o == op {
			return true
		}
	}
	return false
}

// Payment statuses (gateway-api.md).
const (
	StatusPending    = "pending"
	StatusAuthorized = "authorized"
	StatusSucceeded  = "succeeded"
	StatusDeclined   = "declined"
	StatusExpired    = "expired"
	StatusReversed   = "reversed"
)

// DefaultDeclineCode is used when a decline names no code.
const DefaultDeclineCode = "card_declined"

// Errors of the Go control methods.
var (
	ErrNotFound   = errors.New("gatewaysim: no such payment")
	ErrWrongState = errors.New("gatewaysim: payment is not in a state that allows this")
	ErrUnknownOp  = errors.New("gatewaysim: unknown operation")
)

// Options configure a Sim. The zero value is a working simulator without auth, webhooks,
// expiry or capture delay.
type Options struct {
	// APIKey is the bearer token clients must send (GATEWAY_API_KEY). Empty disables auth.
	APIKey string
	// WebhookURL receives signed payment.updated events. Empty: no webhooks are sent.
	WebhookURL string
	// WebhookSecret signs the events (GATEWAY_WEBHOOK_SECRET).
	WebhookSecret string
	// CaptureDelay is how long an approved payment stays authorized before it is captured
	// (succeeded). Zero captures at once (still sending both status changes).
	CaptureDelay time.Duration
	// ExpireAfter is how long a payment may stay pending before it expires. Zero: never.
	ExpireAfter time.Duration
	// Now is the clock of every time rule and of webhook signatures. Nil: time.Now.
	Now func() time.Time
	// PublicURL is the base of confirmation_url (e.g. "http://localhost:8090"). Empty: derived
	// from each request's Host.
	PublicURL string
	// Logger receives one line per call and per fault. Nil: discard.
	Logger *slog.Logger
	// TickInterval, when positive, runs Tick on a wall-clock ticker in a goroutine that Close
	// stops. Tests leave it zero and call Tick themselves.
	TickInterval time.Duration
	// WebhookAttempts bounds delivery attempts per event copy. Zero: 5.
	WebhookAttempts int
	// WebhookBackoff is the wait before the first retry, doubling after each (wall clock,
	// capped at 1 min). Zero: 500 ms.
	WebhookBackoff time.Duration
	// WebhookTimeout bounds one delivery attempt. Zero: 10 s.
	WebhookTimeout time.Duration
	// WebhookClient supplies the transport for deliveries. Nil: a private one.
	WebhookClient *http.Client
	// Seed makes the random fault rates reproducible. Zero: random.
	Seed uint64
}

// Payment is a snapshot of one simulated payment.
type Payment struct {
	ID        string
	Status    string
	Amount    int64
	Currency  string
	Reference string
	ReturnURL string
	// ConfirmationURL is the hosted page, built from PublicURL or the registering request's host.
	ConfirmationURL string
	DeclineCode     string
	Created         time.Time
	Refunded        int64 // sum of refunds
}

// Refund is a snapshot of one simulated refund.
type Refund struct {
	ID        string
	PaymentID string
	Amount    int64
	Status    string
}

// Faults are the injected misbehaviours of one operation.
type Faults struct {
	// Latency delays every call before it is processed (after its idempotency key is taken,
	// so a second call with the same key meanwhile sees 409).
	Latency time.Duration
	// ErrorRate is the probability (0..1) that a call answers 503 without being processed.
	ErrorRate float64
	// FailNext answers the next N calls with 503 without processing them.
	FailNext int
	// DropRate is the probability that a call is processed and its answer then dropped: the
	// connection is closed without a byte written.
	DropRate float64
	// DropNext drops the answers of the next N processed calls. A replay of a finished key
	// counts as processed: its answer can be lost as well.
	DropNext int
}

// Calls are the counts of calls received since the last Reset, including refused ones.
type Calls struct {
	Ops  map[Op]int     `json:"ops"`
	Keys map[string]int `json:"keys"` // by Idempotency-Key, across operations
}

type payment struct {
	Payment
	seq          int64
	authorizedAt time.Time
}

type idemRecord struct {
	fingerprint string
	done        bool
	resourceID  string // payment id (register, reverse) or refund id (refund)
}

type gate struct{ release chan struct{} }

// Sim is the simulated gateway. Create it with New, serve it with ServeHTTP, stop it with Close.
type Sim struct {
	opts    Options
	now     func() time.Time
	log     *slog.Logger
	handler http.Handler
	wh      *webhooks // nil without a WebhookURL

	mu         sync.Mutex
	payments   map[string]*payment
	byRef      map[string][]*payment
	refunds    map[string]*Refund
	keys       map[string]*idemRecord
	seq        int64
	faults     map[Op]Faults
	ignoreKeys bool
	pauses     map[Op]*gate
	parked     map[Op]int
	active     map[Op]int
	calls      map[Op]int
	keyCalls   map[string]int
	lookups    map[string]int // find calls per reference asked for
	rng        *mathrand.Rand
	closed     bool
	changed    chan struct{} // closed and replaced whenever parked/active counts change

	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New builds a simulator and starts its webhook sender (if WebhookURL is set) and ticker (if
// TickInterval is set). Call Close to stop them.
func New(opts Options) *Sim {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	seed := opts.Seed
	if seed == 0 {
		seed = mathrand.Uint64()
	}
	s := &Sim{
		opts:    opts,
		now:     opts.Now,
		log:     opts.Logger,
		rng:     mathrand.New(mathrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	s.resetLocked()
	if opts.WebhookURL != "" {
		s.wh = newWebhooks(opts, s.log)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.wh.run()
		}()
	}
	if opts.TickInterval > 0 {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			t := time.NewTicker(opts.TickInterval)
			defer t.Stop()
			for {
				select {
				case <-s.done:
					return
				case <-t.C:
					s.Tick()
				}
			}
		}()
	}
	s.handler = s.routes()
	return s
}

// Close releases every parked call, stops the ticker and the webhook sender (aborting a
// delivery in flight; queued events are dropped) and waits for their goroutines. Calls that
// arrive afterwards answer 503. Close is idempotent.
func (s *Sim) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for op, g := range s.pauses {
			close(g.release)
			delete(s.pauses, op)
		}
		s.notifyLocked()
		s.mu.Unlock()
		close(s.done)
		if s.wh != nil {
			s.wh.stop()
		}
		s.wg.Wait()
		if s.wh != nil {
			s.wh.client.CloseIdleConnections()
		}
	})
	return nil
}

// ServeHTTP serves the API, the hosted page and the /_sim control API.
func (s *Sim) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Reset forgets every payment, refund, idempotency key, fault, pause (parked calls are
// released), call count and queued or held webhook, as if the simulator had just started.
func (s *Sim) Reset() {
	s.mu.Lock()
	for _, g := range s.pauses {
		close(g.release)
	}
	s.resetLocked()
	s.notifyLocked()
	s.mu.Unlock()
	if s.wh != nil {
		s.wh.reset()
	}
}

func (s *Sim) resetLocked() {
	s.payments = map[string]*payment{}
	s.byRef = map[string][]*payment{}
	s.refunds = map[string]*Refund{}
	s.keys = map[string]*idemRecord{}
	s.faults = map[Op]Faults{}
	s.ignoreKeys = false
	s.pauses = map[Op]*gate{}
	s.calls = map[Op]int{}
	s.keyCalls = map[string]int{}
	s.lookups = map[string]int{}
	if s.parked == nil {
		s.parked = map[Op]int{}
		s.active = map[Op]int{}
	}
	// parked and active describe calls running right now; they survive a reset and drain.
}

func (s *Sim) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitFor blocks until cond (evaluated under s.mu) holds or ctx ends.
func (s *Sim) waitFor(ctx context.Context, cond func() bool) error {
	for {
		s.mu.Lock()
		if cond() {
			s.mu.Unlock()
			return nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ---- faults, pauses, counts ----

// SetFaults replaces the faults of op.
func (s *Sim) SetFaults(op Op, f Faults) error {
	if !validOp(op) {
		return fmt.Errorf("%w %q", ErrUnknownOp, op)
	}
	s.mu.Lock()
	s.faults[op] = f
	s.mu.Unlock()
	return nil
}

// Faults returns the current faults of op.
func (s *Sim) Faults(op Op) Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults[op]
}

// FailNext makes the next n calls of op answer 503 without processing them.
func (s *Sim) FailNext(op Op, n int) {
	s.mu.Lock()
	f := s.faults[op]
	f.FailNext = n
	s.faults[op] = f
	s.mu.Unlock()
}

// DropNext makes the next n calls of op be processed and their answers dropped.
func (s *Sim) DropNext(op Op, n int) {
	s.mu.Lock()
	f := s.faults[op]
	f.DropNext = n
	s.faults[op] = f
	s.mu.Unlock()
}

// SetIgnoreIdempotencyKeys switches the mode of a gateway that cannot be trusted with keys:
// every call is processed as new, whatever its Idempotency-Key.
func (s *Sim) SetIgnoreIdempotencyKeys(on bool) {
	s.mu.Lock()
	s.ignoreKeys = on
	s.mu.Unlock()
}

// Pause parks every call of op that reaches processing (after its idempotency key is taken)
// until Release(op). Pausing a paused op does nothing.
func (s *Sim) Pause(op Op) error {
	if !validOp(op) {
		return fmt.Errorf("%w %q", ErrUnknownOp, op)
	}
	s.mu.Lock()
	if s.pauses[op] == nil && !s.closed {
		s.pauses[op] = &gate{release: make(chan struct{})}
	}
	s.mu.Unlock()
	return nil
}

// Release ends the pause of op and lets every parked call of op continue.
func (s *Sim) Release(op Op) {
	s.mu.Lock()
	if g := s.pauses[op]; g != nil {
		close(g.release)
		delete(s.pauses, op)
	}
	s.mu.Unlock()
}

// Parked returns how many calls of op are parked right now.
func (s *Sim) Parked(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parked[op]
}

// WaitParked blocks until at least n calls of op are parked (or ctx ends).
func (s *Sim) WaitParked(ctx context.Context, op Op, n int) error {
	return s.waitFor(ctx, func() bool { return s.parked[op] >= n })
}

// WaitIdle blocks until no call of op is being handled (or ctx ends): after Release, the
// released calls have finished and their answers were written or dropped.
func (s *Sim) WaitIdle(ctx context.Context, op Op) error {
	return s.waitFor(ctx, func() bool { return s.active[op] == 0 })
}

// WaitCalls blocks until at least n calls of op have arrived since the last Reset (or ctx
// ends): "the service has made its call", whatever then happens to it.
func (s *Sim) WaitCalls(ctx context.Context, op Op, n int) error {
	return s.waitFor(ctx, func() bool { return s.calls[op] >= n })
}

// WaitLookups blocks until the payments of reference were asked for (a find call naming it) n
// times since the last Reset: a test that must know a particular look-up is under way, not the
// patrol's health probe or another payment's.
func (s *Sim) WaitLookups(ctx context.Context, reference string, n int) error {
	return s.waitFor(ctx, func() bool { return s.lookups[reference] >= n })
}

// Calls returns the call counts since the last Reset.
func (s *Sim) Calls() Calls {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Calls{Ops: make(map[Op]int, len(s.calls)), Keys: make(map[string]int, len(s.keyCalls))}
	for k, v := range s.calls {
		c.Ops[k] = v
	}
	for k, v := range s.keyCalls {
		c.Keys[k] = v
	}
	return c
}

// CallCount returns how many calls of op were received since the last Reset.
func (s *Sim) CallCount(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// KeyCallCount returns how many calls carried this Idempotency-Key since the last Reset.
func (s *Sim) KeyCallCount(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keyCalls[key]
}

// ---- payments ----

// Payments returns every payment, newest first.
func (s *Sim) Payments() []Payment {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	all := make([]*payment, 0, len(s.payments))
	for _, p := range s.payments {
		s.settleLocked(p, now)
		all = append(all, p)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].seq > all[j].seq })
	out := make([]Payment, len(all))
	for i, p := range all {
		out[i] = p.Payment
	}
	return out
}

// PaymentsByReference returns the payments carrying reference, newest first.
func (s *Sim) PaymentsByReference(reference string) []Payment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byReferenceLocked(reference, s.now())
}

func (s *Sim) byReferenceLocked(reference string, now time.Time) []Payment {
	list := s.byRef[reference]
	out := make([]Payment, 0, len(list))
	for i := len(list) - 1; i >= 0; i-- { // appended in creation order
		s.settleLocked(list[i], now)
		out = append(out, list[i].Payment)
	}
	return out
}

// Payment returns one payment.
func (s *Sim) Payment(id string) (Payment, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.payments[id]
	if p == nil {
		return Payment{}, false
	}
	s.settleLocked(p, s.now())
	return p.Payment, true
}

// Approve is the customer's Approve button: pending → authorized, then captured (succeeded)
// after CaptureDelay, at once if it is zero.
func (s *Sim) Approve(id string) (Payment, error) {
	return s.act(id, func(p *payment, now time.Time) error {
		if p.Status != StatusPending {
			return fmt.Errorf("%w: approve a %s payment", ErrWrongState, p.Status)
		}
		s.setStatusLocked(p, StatusAuthorized, now)
		return nil
	})
}

// Decline is the customer's Decline button: pending → declined with code (DefaultDeclineCode
// when empty).
func (s *Sim) Decline(id, code string) (Payment, error) {
	if code == "" {
		code = DefaultDeclineCode
	}
	return s.act(id, func(p *payment, now time.Time) error {
		if p.Status != StatusPending {
			return fmt.Errorf("%w: decline a %s payment", ErrWrongState, p.Status)
		}
		p.DeclineCode = code
		s.setStatusLocked(p, StatusDeclined, now)
		return nil
	})
}

// Succeed captures a pending or authorized payment now, whatever the capture delay.
func (s *Sim) Succeed(id string) (Payment, error) {
	return s.act(id, func(p *payment, now time.Time) error {
		switch p.Status {
		case StatusPending:
			s.setStatusLocked(p, StatusAuthorized, now)
		case StatusAuthorized:
		default:
			return fmt.Errorf("%w: capture a %s payment", ErrWrongState, p.Status)
		}
		s.setStatusLocked(p, StatusSucceeded, now)
		return nil
	})
}

// Expire expires a pending payment now, whatever ExpireAfter says.
func (s *Sim) Expire(id string) (Payment, error) {
	return s.act(id, func(p *payment, now time.Time) error {
		if p.Status != StatusPending {
			return fmt.Errorf("%w: expire a %s payment", ErrWrongState, p.Status)
		}
		s.setStatusLocked(p, StatusExpired, now)
		return nil
	})
}

func (s *Sim) act(id string, f func(p *payment, now time.Time) error) (Payment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.payments[id]
	if p == nil {
		return Payment{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	now := s.now()
	s.settleLocked(p, now)
	if err := f(p, now); err != nil {
		return p.Payment, err
	}
	s.settleLocked(p, now) // a zero capture delay captures at once
	return p.Payment, nil
}

// Tick brings every payment up to date with the clock (captures, expiries) and so sends the
// webhooks of whatever changed. Reads do the same for the payments they touch.
func (s *Sim) Tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	all := make([]*payment, 0, len(s.payments))
	for _, p := range s.payments {
		all = append(all, p)
	}
	// Creation order, so the webhooks of one Tick go out in a stable order.
	sort.Slice(all, func(i, j int) bool { return all[i].seq < all[j].seq })
	for _, p := range all {
		s.settleLocked(p, now)
	}
}

// settleLocked applies the time rules to p as of now.
func (s *Sim) settleLocked(p *payment, now time.Time) {
	if p.Status == StatusPending && s.opts.ExpireAfter > 0 && !now.Before(p.Created.Add(s.opts.ExpireAfter)) {
		s.setStatusLocked(p, StatusExpired, now)
	}
	if p.Status == StatusAuthorized && !now.Before(p.authorizedAt.Add(s.opts.CaptureDelay)) {
		s.setStatusLocked(p, StatusSucceeded, now)
	}
}

// setStatusLocked is the one place a payment's status changes, so every change sends its webhook.
func (s *Sim) setStatusLocked(p *payment, status string, now time.Time) {
	from := p.Status
	p.Status = status
	if status == StatusAuthorized {
		p.authorizedAt = now
	}
	s.log.Info("gatewaysim: status", "payment", p.ID, "from", from, "to", status)
	if s.wh != nil {
		s.wh.enqueue(newEvent(p.Payment, now), isFinal(status))
	}
}

func isFinal(status string) bool {
	switch status {
	case StatusSucceeded, StatusDeclined, StatusExpired, StatusReversed:
		return true
	}
	return false
}

func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return prefix + hex.EncodeToString(b)
}

// publicBase is the base of confirmation_url: PublicURL, or the request's host.
func (s *Sim) publicBase(r *http.Request) string {
	if s.opts.PublicURL != "" {
		return trimSlash(s.opts.PublicURL)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func trimSlash(u string) string {
	for len(u) > 0 && u[len(u)-1] == '/' {
		u = u[:len(u)-1]
	}
	return u
}
