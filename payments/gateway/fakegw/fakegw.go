// Package fakegw is an in-memory payments.Gateway for tests of the core: it counts calls per
// operation, per idempotency key and per payment, fails on command (definitively, transiently,
// "processed but the answer was lost", not sent), can ignore idempotency keys like an
// untrustworthy gateway, forget refund keys like Stripe after 24 hours, go down as a whole (an
// outage), answer after a fixed latency, and can hold calls of an operation at a gate so a test
// decides exactly when each one proceeds. It is also the gateway of the benchmark program.
package fakegw

import (
	"context"
	"fmt"
	"sync"
	"time"

	"pitlane/payments"
)

// Operations, as counted.
const (
	OpRegister = "register"
	OpStatus   = "status"
	OpFind     = "find"
	OpReverse  = "reverse"
	OpRefund   = "refund"
	// OpRefundStatus reads a refund by its id; OpFindRefund searches one by our key.
	OpRefundStatus = "refund_status"
	OpFindRefund   = "find_refund"
)

// Fault is what the next call(s) of an operation do instead of answering normally.
type Fault int

const (
	// Definitive: a 4xx refusal; nothing processed.
	Definitive Fault = iota + 1
	// Transient: a 5xx before processing; nothing processed, but the caller cannot know.
	Transient
	// LostAnswer: processed, then the answer was lost (timeout / broken connection).
	LostAnswer
	// NotSent: the connection was refused; nothing processed, and the caller knows it.
	NotSent
)

// Gateway is the fake. The zero value is not usable; call New.
type Gateway struct {
	mu         sync.Mutex
	seq        int
	payments   map[string]*payments.GatewayPayment
	byKey      map[string]string // register key → payment id
	reverseKey map[string]string // reverse key → payment id
	calls      map[string]int    // op → count
	keyCalls   map[string]int    // op + "\x00" + key → count
	idCalls    map[string]int    // op + "\x00" + payment id → count
	faults     map[string][]Fault
	gates      map[string]*Gate
	ignoreKeys bool
	now        func() time.Time

	refunds       map[string]*payments.GatewayRefund // refund id → refund
	refundByKey   map[string]string                  // idempotency key → refund id (ForgetRefundKeys clears it)
	refundKey     map[string]string                  // refund id → the key it was made with (its metadata)
	refundOutcome string                             // status of new refunds: succeeded (default) or pending
	keyRetention  time.Duration
	// refundAmount, when not 0, is what refund answers say was refunded (MisreportRefunds).
	refundAmount int64
	// confirmationURL, when set, is the confirmation_url of later registrations.
	confirmationURL string

	latency     time.Duration
	outage      bool
	inFlight    int
	maxInFlight int
}

// New returns an empty fake gateway.
func New() *Gateway {
	return &Gateway{
		payments:   map[string]*payments.GatewayPayment{},
		byKey:      map[string]string{},
		reverseKey: map[string]string{},
		calls:      map[string]int{},
		keyCalls:   map[string]int{},
		idCalls:    map[string]int{},
		faults:     map[string][]Fault{},
		gates:      map[string]*Gate{},
		now:        func() time.Time { return time.Unix(1764489600, 0).UTC() },

		refunds:       map[string]*payments.GatewayRefund{},
		refundByKey:   map[string]string{},
		refundKey:     map[string]string{},
		refundOutcome: "succeeded",
	}
}

// SetLatency makes every call take d before it is answered (wall clock; the benchmark's and the
// concurrency test's gateway speed). A call whose context ends first fails as unknown.
func (g *Gateway) SetLatency(d time.Duration) {
	g.mu.Lock()
	g.latency = d
	g.mu.Unlock()
}

// Outage makes every call fail as a 5xx (nothing processed) while on: the gateway is down.
func (g *Gateway) Outage(on bool) {
	g.mu.Lock()
	g.outage = on
	g.mu.Unlock()
}

// MaxInFlight is the largest number of calls that were being answered at the same moment.
func (g *Gateway) MaxInFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.maxInFlight
}

// SetKeyRetention sets what KeyRetention reports (0: keys are kept forever, the default).
func (g *Gateway) SetKeyRetention(d time.Duration) {
	g.mu.Lock()
	g.keyRetention = d
	g.mu.Unlock()
}

// ForgetRefundKeys forgets every refund idempotency key, as Stripe does after 24 hours: the same
// key sent again makes a new refund. Refunds keep the key in their metadata (FindRefund).
func (g *Gateway) ForgetRefundKeys() {
	g.mu.Lock()
	g.refundByKey = map[string]string{}
	g.mu.Unlock()
}

// SetRefundOutcome sets the status new refunds get: "succeeded" (default), "pending" or "failed".
func (g *Gateway) SetRefundOutcome(status string) {
	g.mu.Lock()
	g.refundOutcome = status
	g.mu.Unlock()
}

// SetRefundStatus moves every refund made for payment id (pending → succeeded, …).
func (g *Gateway) SetRefundStatus(paymentID, status string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.refunds {
		if r.PaymentID == paymentID {
			r.Status = status
		}
	}
}

// Refunds counts the refunds made for a payment (what the customer would get back).
func (g *Gateway) Refunds(paymentID string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, r := range g.refunds {
		if r.PaymentID == paymentID {
			n++
		}
	}
	return n
}

func (g *Gateway) Name() string { return "fake" }

// Fail makes the next n calls of op fail with f (queued after faults already set).
func (g *Gateway) Fail(op string, f Fault, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for range n {
		g.faults[op] = append(g.faults[op], f)
	}
}

// IgnoreKeys makes the fake behave like a gateway that cannot be trusted with idempotency keys.
func (g *Gateway) IgnoreKeys(on bool) {
	g.mu.Lock()
	g.ignoreKeys = on
	g.mu.Unlock()
}

// Calls returns how many calls of op arrived (whatever their outcome).
func (g *Gateway) Calls(op string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[op]
}

// KeyCalls returns how many calls of op carried key.
func (g *Gateway) KeyCalls(op, key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.keyCalls[op+"\x00"+key]
}

// RefundKey returns the idempotency key refund rid was made with ("" when there is none).
func (g *Gateway) RefundKey(rid string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refundKey[rid]
}

// PaymentCalls returns how many calls of op (status, reverse) named the payment id.
func (g *Gateway) PaymentCalls(op, id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.idCalls[op+"\x00"+id]
}

// Payments returns how many payments the gateway holds (what a customer could be charged for).
func (g *Gateway) Payments() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.payments)
}

// PaymentsWithReference counts the gateway payments carrying a reference.
func (g *Gateway) PaymentsWithReference(ref string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, p := range g.payments {
		if p.Reference == ref {
			n++
		}
	}
	return n
}

// SetStatus moves a gateway payment (the customer approved, the gateway captured, …).
func (g *Gateway) SetStatus(id string, st payments.GatewayStatus) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p, ok := g.payments[id]; ok {
		p.Status = st
		if st == payments.GatewayDeclined {
			p.DeclineCode = "card_declined"
		}
	}
}

// Forget drops a payment from the gateway's books (a payment made on another account, a test
// mode's data wiped): every call naming it is answered 404 not_found.
func (g *Gateway) Forget(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.payments, id)
}

// SetAmount makes the gateway report another amount and currency for a payment (a gateway that
// captured less, or in another currency, than the session asked for).
func (g *Gateway) SetAmount(id string, amount int64, currency string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p, ok := g.payments[id]; ok {
		p.Amount, p.Currency = amount, currency
	}
}

// MisreportRefunds makes every later refund answer say amount instead of the amount asked for
// (0: answer truthfully again).
func (g *Gateway) MisreportRefunds(amount int64) {
	g.mu.Lock()
	g.refundAmount = amount
	g.mu.Unlock()
}

// SetConfirmationURL makes later registrations answer u as their confirmation_url (a gateway
// sending customers somewhere it should not); "" restores https://fake.gateway/pay/{id}.
func (g *Gateway) SetConfirmationURL(u string) {
	g.mu.Lock()
	g.confirmationURL = u
	g.mu.Unlock()
}

// SetStatusByReference moves every payment carrying ref.
func (g *Gateway) SetStatusByReference(ref string, st payments.GatewayStatus) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.payments {
		if p.Reference == ref {
			p.Status = st
		}
	}
}

// Payment returns a copy of one gateway payment.
func (g *Gateway) Payment(id string) (payments.GatewayPayment, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.payments[id]
	if !ok {
		return payments.GatewayPayment{}, false
	}
	return *p, true
}

// Gate holds calls of one operation until the test lets them go.
type Gate struct {
	arrived chan string
	release chan struct{}
	once    sync.Once
}

// Hold makes every later call of op stop at a gate: it announces itself on Arrived (with its key
// or payment id) and waits for Release/Open, or for its context to end (→ an unknown failure,
// like a client timeout).
func (g *Gateway) Hold(op string) *Gate {
	gate := &Gate{arrived: make(chan string, 10000), release: make(chan struct{})}
	g.mu.Lock()
	g.gates[op] = gate
	g.mu.Unlock()
	return gate
}

// Unhold removes the gate of op (calls already waiting stay until released).
func (g *Gateway) Unhold(op string) {
	g.mu.Lock()
	delete(g.gates, op)
	g.mu.Unlock()
}

// Arrived announces each held call.
func (gt *Gate) Arrived() <-chan string { return gt.arrived }

// Release lets one held call proceed.
func (gt *Gate) Release() { gt.release <- struct{}{} }

// Open lets every held call, now and later, proceed.
func (gt *Gate) Open() { gt.once.Do(func() { close(gt.release) }) }

// enter counts a call, waits at a gate if one is set, and returns the fault to apply (0 = none).
func (g *Gateway) enter(ctx context.Context, op, key, id string) (Fault, error) {
	g.mu.Lock()
	g.calls[op]++
	if key != "" {
		g.keyCalls[op+"\x00"+key]++
	}
	if id != "" {
		g.idCalls[op+"\x00"+id]++
	}
	gate := g.gates[op]
	latency, outage := g.latency, g.outage
	g.inFlight++
	g.maxInFlight = max(g.maxInFlight, g.inFlight)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inFlight--
		g.mu.Unlock()
	}()
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, &payments.GatewayError{Kind: payments.FailureUnknown, Op: op, Err: ctx.Err()}
		}
	}
	if outage {
		return Transient, nil
	}
	if gate != nil {
		tag := key
		if tag == "" {
			tag = id
		}
		gate.arrived <- tag
		select {
		case <-gate.release:
		case <-ctx.Done():
		}
		if ctx.Err() != nil { // also when released as it ended: an HTTP client's call fails then
			return 0, &payments.GatewayError{Kind: payments.FailureUnknown, Op: op, Err: ctx.Err()}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if q := g.faults[op]; len(q) > 0 {
		g.faults[op] = q[1:]
		return q[0], nil
	}
	return 0, nil
}

func failure(op string, f Fault) error {
	switch f {
	case Definitive:
		return &payments.GatewayError{Kind: payments.FailureDefinitive, Op: op, HTTPStatus: 400, Code: "invalid_request"}
	case Transient:
		return &payments.GatewayError{Kind: payments.FailureUnknown, Op: op, HTTPStatus: 503, Err: fmt.Errorf("service unavailable")}
	case LostAnswer:
		return &payments.GatewayError{Kind: payments.FailureUnknown, Op: op, Err: context.DeadlineExceeded}
	case NotSent:
		return &payments.GatewayError{Kind: payments.FailureNotSent, Op: op, Err: fmt.Errorf("connection refused")}
	}
	return nil
}

func (g *Gateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	f, err := g.enter(ctx, OpRegister, req.IdempotencyKey, "")
	if err != nil {
		return payments.GatewayPayment{}, err
	}
	if f != 0 && f != LostAnswer {
		return payments.GatewayPayment{}, failure(OpRegister, f)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if id, ok := g.byKey[req.IdempotencyKey]; ok && !g.ignoreKeys {
		p := *g.payments[id]
		if f == LostAnswer {
			return payments.GatewayPayment{}, failure(OpRegister, f)
		}
		return p, nil
	}
	g.seq++
	id := fmt.Sprintf("gp_fake_%d", g.seq)
	p := &payments.GatewayPayment{ID: id, Status: payments.GatewayPending, Amount: req.Amount, Currency: req.Currency,
		Reference: req.Reference, ConfirmationURL: "https://fake.gateway/pay/" + id, Created: g.now().Add(time.Duration(g.seq) * time.Second)}
	if g.confirmationURL != "" {
		p.ConfirmationURL = g.confirmationURL
	}
	g.payments[id] = p
	g.byKey[req.IdempotencyKey] = id
	if f == LostAnswer {
		return payments.GatewayPayment{}, failure(OpRegister, f)
	}
	return *p, nil
}

func (g *Gateway) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	f, err := g.enter(ctx, OpStatus, "", id)
	if err != nil {
		return payments.GatewayPayment{}, err
	}
	if f != 0 {
		return payments.GatewayPayment{}, failure(OpStatus, f)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.payments[id]
	if !ok {
		return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: OpStatus, HTTPStatus: 404, Code: "not_found"}
	}
	return *p, nil
}

func (g *Gateway) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	f, err := g.enter(ctx, OpFind, "", ref)
	if err != nil {
		return nil, err
	}
	if f != 0 {
		return nil, failure(OpFind, f)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []payments.GatewayPayment
	for _, p := range g.payments {
		if p.Reference == ref {
			out = append(out, *p)
		}
	}
	// newest first
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Created.After(out[j-1].Created); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

func (g *Gateway) Reverse(ctx context.Context, id, key string) (payments.GatewayPayment, error) {
	f, err := g.enter(ctx, OpReverse, key, id)
	if err != nil {
		return payments.GatewayPayment{}, err
	}
	if f != 0 && f != LostAnswer {
		return payments.GatewayPayment{}, failure(OpReverse, f)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.payments[id]
	if !ok {
		return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: OpReverse, HTTPStatus: 404, Code: "not_found"}
	}
	if prev, ok := g.reverseKey[key]; ok && prev == id && p.Status == payments.GatewayReversed {
		if f == LostAnswer {
			return payments.GatewayPayment{}, failure(OpReverse, f)
		}
		return *p, nil
	}
	switch p.Status {
	case payments.GatewayPending, payments.GatewayAuthorized:
		p.Status = payments.GatewayReversed
		g.reverseKey[key] = id
	case payments.GatewayReversed:
	default:
		return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: OpReverse, HTTPStatus: 409,
			Code: "not_reversible", GatewayStatus: p.Status}
	}
	if f == LostAnswer {
		return payments.GatewayPayment{}, failure(OpReverse, f)
	}
	return *p, nil
}

func (g *Gateway) Refund(ctx context.Context, id, key string, amount int64, _ string) (payments.GatewayRefund, error) {
	f, err := g.enter(ctx, OpRefund, key, id)
	if err != nil {
		return payments.GatewayRefund{}, err
	}
	if f != 0 && f != LostAnswer {
		return payments.GatewayRefund{}, failure(OpRefund, f)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.payments[id]
	if !ok { // Stripe's 404 resource_missing
		return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: OpRefund, HTTPStatus: 404, Code: "not_found"}
	}
	// The key first, as the contract and gatewaysim answer: the same key again is the same
	// refund (200) whatever the payment became since; only a new refund needs it succeeded.
	if rid, ok := g.refundByKey[key]; ok && !g.ignoreKeys {
		if f == LostAnswer {
			return payments.GatewayRefund{}, failure(OpRefund, f)
		}
		return *g.refunds[rid], nil
	}
	if p.Status != payments.GatewaySucceeded {
		return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: OpRefund, HTTPStatus: 409, Code: "not_refundable"}
	}
	g.seq++
	if g.refundAmount != 0 {
		amount = g.refundAmount
	}
	r := &payments.GatewayRefund{ID: fmt.Sprintf("rf_fake_%d", g.seq), PaymentID: id, Amount: amount, Status: g.refundOutcome}
	g.refunds[r.ID] = r
	g.refundByKey[key] = r.ID
	g.refundKey[r.ID] = key
	if f == LostAnswer {
		return payments.GatewayRefund{}, failure(OpRefund, f)
	}
	return *r, nil
}

func (g *Gateway) RefundStatus(ctx context.Context, rid string) (payments.GatewayRefund, error) {
	f, err := g.enter(ctx, OpRefundStatus, "", rid)
	if err != nil {
		return payments.GatewayRefund{}, err
	}
	if f != 0 {
		return payments.GatewayRefund{}, failure(OpRefundStatus, f)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.refunds[rid]
	if !ok {
		return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: OpRefundStatus, HTTPStatus: 404, Code: "not_found"}
	}
	return *r, nil
}

func (g *Gateway) FindRefund(ctx context.Context, paymentID, key string) (payments.GatewayRefund, bool, error) {
	f, err := g.enter(ctx, OpFindRefund, key, paymentID)
	if err != nil {
		return payments.GatewayRefund{}, false, err
	}
	if f != 0 {
		return payments.GatewayRefund{}, false, failure(OpFindRefund, f)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for rid, k := range g.refundKey {
		if r := g.refunds[rid]; k == key && r.PaymentID == paymentID {
			return *r, true, nil
		}
	}
	return payments.GatewayRefund{}, false, nil
}

// KeyRetention implements payments.Gateway (SetKeyRetention; 0 by default).
func (g *Gateway) KeyRetention() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.keyRetention
}

var _ payments.Gateway = (*Gateway)(nil)
