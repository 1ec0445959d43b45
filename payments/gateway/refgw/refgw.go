// Package refgw is pitlane's client for the reference gateway API
// (shared/contracts/gateway-api.md). It must work against any server that honours that page,
// not only against pitlane's simulator, so it relies on nothing the contract does not promise.
//
// Its one hard job is sorting every failure into exactly one payments.FailureKind:
//
//   - FailureDefinitive: the gateway answered with a 4xx refusal; it did not act.
//   - FailureUnknown: a 5xx, a timeout, a broken connection after a connection was obtained, an
//     answer we could not read, 409 idempotency_key_in_use or 422 idempotency_key_reused (an
//     earlier request under the key, with another body). The gateway may have acted.
//   - FailureNotSent: no connection to the gateway was ever obtained, so not one byte of the
//     request left this process; or the gateway refused our credentials (401/403: a wrong or
//     rotated-away GATEWAY_API_KEY), which is no answer about the payment. Certain that nothing
//     happened, and safe to send again.
//
// "Not sent" is decided by httptrace's GotConn, not by inspecting error types: GotConn runs on
// the caller's goroutine before the transport writes anything, so if it never fired, nothing was
// written, whatever the error looks like (refused, DNS, TLS handshake, a deadline during dial).
// The converse is deliberately conservative: once a connection was handed to the request, any
// failure is unknown, even if the transport may not have written yet, because after a timeout
// the transport's writer goroutine can still be writing when Do returns.
package refgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"pitlane/payments"
)

// DefaultTimeout is the budget of one call when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// DefaultMaxResponseBytes bounds how much of an answer the client reads.
const DefaultMaxResponseBytes = 1 << 20

// Options configure a Client.
type Options struct {
	// BaseURL is GATEWAY_URL, e.g. "https://gateway.example" (a path prefix is kept).
	BaseURL string
	// APIKey is GATEWAY_API_KEY, sent as a bearer token.
	APIKey string
	// Timeout is GATEWAY_TIMEOUT: the budget of one call from dial to the last byte of the
	// answer. Zero means DefaultTimeout. A caller's shorter context deadline wins.
	Timeout time.Duration
	// HTTPClient supplies the transport (proxies, TLS, test servers). Its Timeout,
	// CheckRedirect and Jar are not used. Nil means a private clone of http.DefaultTransport.
	HTTPClient *http.Client
	// MaxResponseBytes bounds the answer body; zero means DefaultMaxResponseBytes.
	MaxResponseBytes int64
}

// Client talks to one reference gateway. It is safe for concurrent use.
type Client struct {
	base     string // scheme://host[/prefix] without a trailing slash
	apiKey   string
	timeout  time.Duration
	maxBytes int64
	hc       *http.Client
}

var _ payments.Gateway = (*Client)(nil)

// New checks opts and builds a Client.
func New(opts Options) (*Client, error) {
	if opts.BaseURL == "" {
		return nil, errors.New("refgw: BaseURL (GATEWAY_URL) is required")
	}
	base, err := url.Parse(opts.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("refgw: BaseURL %q is not an http(s) URL", opts.BaseURL)
	}
	base.RawQuery, base.Fragment = "", ""
	if opts.APIKey == "" {
		return nil, errors.New("refgw: APIKey (GATEWAY_API_KEY) is required")
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("refgw: negative Timeout %s", opts.Timeout)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxResponseBytes <= 0 {
		opts.MaxResponseBytes = DefaultMaxResponseBytes
	}
	var rt http.RoundTripper
	if opts.HTTPClient != nil && opts.HTTPClient.Transport != nil {
		rt = opts.HTTPClient.Transport
	} else {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	return &Client{
		base:     strings.TrimRight(base.String(), "/"),
		apiKey:   opts.APIKey,
		timeout:  opts.Timeout,
		maxBytes: opts.MaxResponseBytes,
		hc: &http.Client{
			Transport: rt,
			// A redirect is not part of the contract; following one would re-send a POST
			// somewhere else. Report it as the answer (and so as unknown) instead.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// Name implements payments.Gateway.
func (c *Client) Name() string { return "refgw" }

// CloseIdleConnections closes kept-alive connections (tests, shutdown).
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Operation names, used as GatewayError.Op.
const (
	OpRegister     = "register"
	OpStatus       = "status"
	OpFind         = "find"
	OpReverse      = "reverse"
	OpRefund       = "refund"
	OpRefundStatus = "refund_status"
)

// maxKeyLen is the contract's limit on Idempotency-Key.
const maxKeyLen = 64

// Register implements payments.Gateway: POST /v1/payments with req.IdempotencyKey.
func (c *Client) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	if err := checkKey(OpRegister, req.IdempotencyKey); err != nil {
		return payments.GatewayPayment{}, err
	}
	if req.Reference == "" || req.Amount <= 0 || req.Currency == "" {
		return payments.GatewayPayment{}, invalid(OpRegister, "reference, a positive amount and a currency are required")
	}
	body := registerBody{Amount: req.Amount, Currency: req.Currency, Reference: req.Reference, ReturnURL: req.ReturnURL}
	var p paymentJSON
	if err := c.do(ctx, OpRegister, http.MethodPost, "/v1/payments", nil, req.IdempotencyKey, body, &p); err != nil {
		return payments.GatewayPayment{}, err
	}
	return p.domain(), nil
}

// Status implements payments.Gateway: GET /v1/payments/{id}.
func (c *Client) Status(ctx context.Context, gatewayPaymentID string) (payments.GatewayPayment, error) {
	if gatewayPaymentID == "" {
		return payments.GatewayPayment{}, invalid(OpStatus, "empty payment id")
	}
	var p paymentJSON
	if err := c.do(ctx, OpStatus, http.MethodGet, "/v1/payments/"+url.PathEscape(gatewayPaymentID), nil, "", nil, &p); err != nil {
		return payments.GatewayPayment{}, err
	}
	return p.domain(), nil
}

// FindByReference implements payments.Gateway: GET /v1/payments?reference=R. Only payments
// whose reference equals ours exactly are returned (a server that matched loosely must not get
// someone else's payment attached to our session), newest first.
func (c *Client) FindByReference(ctx context.Context, reference string) ([]payments.GatewayPayment, error) {
	if reference == "" {
		return nil, invalid(OpFind, "empty reference")
	}
	var list paymentList
	q := url.Values{"reference": {reference}}
	if err := c.do(ctx, OpFind, http.MethodGet, "/v1/payments", q, "", nil, &list); err != nil {
		return nil, err
	}
	out := make([]payments.GatewayPayment, 0, len(list.Data))
	for _, p := range list.Data {
		if err := p.check(); err != nil {
			return nil, unknownAnswer(OpFind, http.StatusOK, err)
		}
		if p.Reference == reference {
			out = append(out, p.domain())
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.After(out[j].Created) })
	return out, nil
}

// Reverse implements payments.Gateway: POST /v1/payments/{id}/reverse. A 409 not_reversible
// is definitive with Code "not_reversible" and GatewayStatus from the answer.
func (c *Client) Reverse(ctx context.Context, gatewayPaymentID, idempotencyKey string) (payments.GatewayPayment, error) {
	if err := checkKey(OpReverse, idempotencyKey); err != nil {
		return payments.GatewayPayment{}, err
	}
	if gatewayPaymentID == "" {
		return payments.GatewayPayment{}, invalid(OpReverse, "empty payment id")
	}
	var p paymentJSON
	path := "/v1/payments/" + url.PathEscape(gatewayPaymentID) + "/reverse"
	if err := c.do(ctx, OpReverse, http.MethodPost, path, nil, idempotencyKey, struct{}{}, &p); err != nil {
		return payments.GatewayPayment{}, err
	}
	return p.domain(), nil
}

// Refund implements payments.Gateway: POST /v1/payments/{id}/refunds. The contract's amounts
// are ISO 4217 minor units, as the core's: the currency needs no conversion.
func (c *Client) Refund(ctx context.Context, gatewayPaymentID, idempotencyKey string, amount int64, _ string) (payments.GatewayRefund, error) {
	if err := checkKey(OpRefund, idempotencyKey); err != nil {
		return payments.GatewayRefund{}, err
	}
	if gatewayPaymentID == "" || amount <= 0 {
		return payments.GatewayRefund{}, invalid(OpRefund, "a payment id and a positive amount are required")
	}
	var r refundJSON
	path := "/v1/payments/" + url.PathEscape(gatewayPaymentID) + "/refunds"
	if err := c.do(ctx, OpRefund, http.MethodPost, path, nil, idempotencyKey, refundBody{Amount: amount}, &r); err != nil {
		return payments.GatewayRefund{}, err
	}
	return r.domain(), nil
}

// RefundStatus implements payments.Gateway: GET /v1/refunds/{id}.
func (c *Client) RefundStatus(ctx context.Context, refundID string) (payments.GatewayRefund, error) {
	if refundID == "" {
		return payments.GatewayRefund{}, invalid(OpRefundStatus, "empty refund id")
	}
	var r refundJSON
	if err := c.do(ctx, OpRefundStatus, http.MethodGet, "/v1/refunds/"+url.PathEscape(refundID), nil, "", nil, &r); err != nil {
		return payments.GatewayRefund{}, err
	}
	return r.domain(), nil
}

// FindRefund implements payments.Gateway. The reference gateway's contract has no search for
// refunds, and needs none: it honours an idempotency key for as long as it keeps the payment
// (KeyRetention 0), so repeating the refund with the same key is how a lost answer is found.
func (c *Client) FindRefund(context.Context, string, string) (payments.GatewayRefund, bool, error) {
	return payments.GatewayRefund{}, false, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: "find_refund",
		Code: "unsupported", Err: errors.New("the reference gateway cannot search refunds; repeat the refund with its key")}
}

// KeyRetention implements payments.Gateway: the contract never forgets a key (0).
func (c *Client) KeyRetention() time.Duration { return 0 }

// checker is implemented by answers that can tell whether they are usable.
type checker interface{ check() error }

// do performs one call and returns nil or a *payments.GatewayError.
func (c *Client) do(ctx context.Context, op, method, path string, query url.Values, idemKey string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	target := c.base + path // path segments are already escaped by the callers
	if len(query) > 0 {
		target += "?" + query.Encode()
	}

	var body io.Reader
	var payload []byte
	if in != nil {
		var err error
		if payload, err = json.Marshal(in); err != nil {
			return &payments.GatewayError{Kind: payments.FailureNotSent, Op: op, Err: fmt.Errorf("encode request: %w", err)}
		}
		body = bytes.NewReader(payload)
	}

	var gotConn atomic.Bool
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { gotConn.Store(true) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, target, body)
	if err != nil {
		return &payments.GatewayError{Kind: payments.FailureNotSent, Op: op, Err: fmt.Errorf("build request: %w", err)}
	}
	// net/http treats a request carrying Idempotency-Key as replayable and silently re-sends it
	// on a reused connection that broke before the answer. That retry is not ours to make: with
	// a gateway that ignores keys it creates a second payment, and it hides an unknown outcome
	// from the core. Without GetBody the transport cannot replay a body, so it does not.
	req.GetBody = nil
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json")
	// The contract: "Every request: … Content-Type: application/json", GETs and bodiless
	// POSTs (reverse) included; a strict gateway may refuse a request without it.
	req.Header.Set("Content-Type", "application/json")
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}

	resp, err := c.hc.Do(req)
	if err != nil {
		kind := payments.FailureUnknown
		if !gotConn.Load() {
			kind = payments.FailureNotSent
		}
		return &payments.GatewayError{Kind: kind, Op: op, Err: err}
	}
	defer resp.Body.Close()

	raw, readErr := io.ReadAll(io.LimitReader(resp.Body, c.maxBytes+1))
	if readErr == nil && int64(len(raw)) > c.maxBytes {
		readErr = fmt.Errorf("answer larger than %d bytes", c.maxBytes)
	}

	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		if readErr != nil {
			return unknownAnswer(op, resp.StatusCode, fmt.Errorf("read answer: %w", readErr))
		}
		if err := decodeExact(raw, out); err != nil {
			return unknownAnswer(op, resp.StatusCode, fmt.Errorf("decode answer: %w", err))
		}
		if ch, ok := out.(checker); ok {
			if err := ch.check(); err != nil {
				return unknownAnswer(op, resp.StatusCode, err)
			}
		}
		return nil

	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		var e errorJSON
		_ = decodeExact(raw, &e)
		ge := &payments.GatewayError{
			Kind:          payments.FailureDefinitive,
			Op:            op,
			HTTPStatus:    resp.StatusCode,
			Code:          e.Error,
			GatewayStatus: payments.GatewayStatus(e.Status),
		}
		switch {
		case op == OpRefundStatus && resp.StatusCode == http.StatusNotFound && ge.Code == "" && (len(bytes.TrimSpace(raw)) == 0 || json.Valid(raw)):
			// The contract's refund look-up answers 404 for a refund it does not have, its body
			// unspecified: empty or JSON. A balancer's HTML 404 is not the gateway's word
			// (below).
			ge.Code = "not_found"
		case resp.StatusCode == http.StatusNotFound && ge.Code != "not_found":
			// The contract's "no such payment" is 404 {"error":"not_found"}. A 404 without it is
			// a balancer's or a misrouted deploy's answer, not the gateway's word: read as a
			// missing payment, a few minutes of it flagged every session the patrol, a page or
			// a webhook looked at (an outside review), and counted as answers it never backed
			// off. Unknown, asked again, and counted as the gateway failing.
			ge.Kind = payments.FailureUnknown
		case ge.Code == "":
			// A refusal is the gateway's word: its error body names what it refused. A 4xx
			// whose body names nothing (a proxy's HTML page, a body cut short) may stand in
			// front of a request the gateway carried out — a 409 for an idempotency key still
			// in use, a 422 for one reused — and read as a refusal it failed a payment the
			// gateway made, or a refund it paid, making the amount refundable again. Unknown:
			// asked again with the same key, or looked up.
			ge.Kind = payments.FailureUnknown
		}
		if ge.Code == "" {
			ge.Code = defaultCode(resp.StatusCode)
		}
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			// Our credentials were refused (GATEWAY_API_KEY wrong, or rotated away): the gateway
			// did nothing, and nothing about the payment was refused. Like a call that never
			// reached it: safe to send again once the key is right, counted as the gateway
			// failing (the error-ratio alert), and no payment is failed for it.
			ge.Kind = payments.FailureNotSent
		}
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooEarly {
			// "Slow down" and "your request took too long": neither refuses the payment, and a
			// 408 may come from a proxy while the gateway still works on the request. Not a
			// refusal (which fails a registration, or ends a confirmed cancel): unknown, asked
			// again with the same key, and counted as the gateway failing, so the patrol backs
			// off instead of hammering a gateway that throttles it. Stripe's adapter says so too.
			// 425 "too early" (a request replayed too soon) likewise.
			ge.Kind = payments.FailureUnknown
		}
		if op == OpRegister && (resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusUnprocessableEntity) {
			// The contract's only 409 and 422 to a registration are about its idempotency key
			// (in use, reused), and either way the gateway may hold a payment under it. Read
			// as a refusal, a code the contract does not list (its own spelling, capitals) failed
			// a session the gateway went on to register (an outside review): unknown, found by
			// the key or by reference.
			ge.Kind = payments.FailureUnknown
		}
		if op == OpRefund && (resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusUnprocessableEntity) &&
			ge.Code != "not_refundable" && ge.Code != "amount_exceeds_remaining" {
			// A refund's refusals are the contract's two 409s (not refundable, over the remaining
			// amount; either code under a 422 is read as the same refusal). Any other code — the key's in use in capitals, a
			// gateway's own "refund in progress" — may stand in front of a refund it is paying:
			// read as a refusal, the refund was Failed and its amount refundable again beside
			// the one the gateway paid (a review of late sends). Unknown: asked again with the
			// same key, or looked up.
			ge.Kind = payments.FailureUnknown
		}
		switch ge.Code {
		case "idempotency_key_in_use":
			// The first request with this key is still running at the gateway and may yet
			// succeed: that is not a refusal.
			ge.Kind = payments.FailureUnknown
		case "idempotency_key_reused":
			// The gateway holds an earlier request under this key whose body differs — a
			// registration sent by another replica, whose return URL is its own
			// PUBLIC_BASE_URL. It may have acted on that one (or be acting on it still): not a
			// refusal of the payment. What it did is found by reference.
			ge.Kind = payments.FailureUnknown
		}
		ge.Err = errors.New(describe(resp.Status, e.Message, readErr))
		return ge

	default: // 5xx, and anything the contract does not define (1xx, 3xx)
		var e errorJSON
		_ = decodeExact(raw, &e)
		return &payments.GatewayError{
			Kind: payments.FailureUnknown, Op: op, HTTPStatus: resp.StatusCode, Code: e.Error,
			Err: errors.New(describe(resp.Status, e.Message, readErr)),
		}
	}
}

func describe(status, message string, readErr error) string {
	s := status
	if message != "" {
		s += ": " + message
	}
	if readErr != nil {
		s += " (reading the answer: " + readErr.Error() + ")"
	}
	return s
}

func defaultCode(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "unauthorized"
	case http.StatusBadRequest:
		return "invalid_request"
	default:
		return fmt.Sprintf("http_%d", status)
	}
}

func unknownAnswer(op string, status int, err error) error {
	return &payments.GatewayError{Kind: payments.FailureUnknown, Op: op, HTTPStatus: status, Code: "unreadable_answer", Err: err}
}

// invalid is a refusal made before sending: what the gateway would answer with a 400. It is
// definitive (nothing was sent, and sending it again would not help).
func invalid(op, msg string) error {
	return &payments.GatewayError{Kind: payments.FailureDefinitive, Op: op, Code: "invalid_request", Err: errors.New(msg)}
}

func checkKey(op, key string) error {
	if key == "" || len(key) > maxKeyLen {
		return invalid(op, fmt.Sprintf("Idempotency-Key must be 1–%d characters", maxKeyLen))
	}
	return nil
}

// Wire types. They are private to the client on purpose: the simulator has its own, so a
// mismatch between the two shows up in tests instead of being shared silently.

type registerBody struct {
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference"`
	ReturnURL string `json:"return_url,omitempty"`
}

type refundBody struct {
	Amount int64 `json:"amount"`
}

type errorJSON struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	Status  string `json:"status"`
}

type paymentJSON struct {
	ID              string          `json:"id"`
	Status          string          `json:"status"`
	Amount          wireAmount      `json:"amount"`
	Currency        string          `json:"currency"`
	Reference       string          `json:"reference"`
	ConfirmationURL string          `json:"confirmation_url"`
	Created         json.RawMessage `json:"created"` // unix seconds; read by unixSeconds, never failing the answer
	DeclineCode     *string         `json:"decline_code"`
}

func (p *paymentJSON) check() error {
	if p.ID == "" || p.Status == "" {
		return errors.New("answer is not a payment object (no id or status)")
	}
	return nil
}

func (p *paymentJSON) domain() payments.GatewayPayment {
	g := payments.GatewayPayment{
		ID:              p.ID,
		Status:          payments.GatewayStatus(p.Status),
		Amount:          int64(p.Amount),
		Currency:        p.Currency,
		Reference:       p.Reference,
		ConfirmationURL: p.ConfirmationURL,
	}
	g.Created = unixSeconds(p.Created)
	if p.DeclineCode != nil {
		g.DeclineCode = *p.DeclineCode
	}
	return g
}

// unixSeconds reads the payment's "created": the contract's integer, or the same instant
// written as any other JSON number (1764489600.0, 1.7644896e9). Anything else (out of range, 0,
// a string that is no number, null) is no time at all: an unreadable "created" must not make
// the whole answer unreadable (a registration left Unknown, every check failing); it only
// orders the look-up's list.
func unixSeconds(raw json.RawMessage) time.Time {
	var n json.Number
	if len(raw) == 0 || json.Unmarshal(raw, &n) != nil || n == "" {
		return time.Time{}
	}
	if i, err := n.Int64(); err == nil {
		if i > 0 && i < maxUnix {
			return time.Unix(i, 0).UTC()
		}
		return time.Time{}
	}
	if f, err := n.Float64(); err == nil && f > 0 && f < maxUnix {
		return time.Unix(int64(f), 0).UTC()
	}
	return time.Time{}
}

// maxUnix: the year 5138; beyond it a "created" is no time at all.
const maxUnix = 1 << 37

// wireAmount is an amount in minor units as the gateway writes it: the contract's integer, or
// the same integer written as any JSON number (1999.0, 1.999e3: a gateway serialising through
// floats or decimals; JSON has one number type). A number that is no whole amount (1999.5) or
// is beyond what a float holds exactly fails the answer as unreadable, as before.
type wireAmount int64

func (a *wireAmount) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // as an int64 field reads it: no amount (0)
	}
	if len(b) > 0 && b[0] == '"' {
		return fmt.Errorf("amount %s is a string, not a number", b)
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	if i, err := n.Int64(); err == nil {
		*a = wireAmount(i)
		return nil
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return fmt.Errorf("amount %s is not a whole number of minor units", n)
	}
	*a = wireAmount(int64(f))
	return nil
}

type paymentList struct {
	Data []paymentJSON `json:"data"`
}

// check refuses an answer without "data": reading garbage as "no payment with this reference"
// would let the core register a second payment.
func (l *paymentList) check() error {
	if l.Data == nil {
		return errors.New(`answer has no "data" list`)
	}
	return nil
}

type refundJSON struct {
	ID        string     `json:"id"`
	PaymentID string     `json:"payment_id"`
	Amount    wireAmount `json:"amount"`
	Status    string     `json:"status"`
}

func (r *refundJSON) check() error {
	if r.ID == "" || r.Status == "" {
		return errors.New("answer is not a refund object (no id or status)")
	}
	return nil
}

func (r *refundJSON) domain() payments.GatewayRefund {
	return payments.GatewayRefund{ID: r.ID, PaymentID: r.PaymentID, Amount: int64(r.Amount), Status: r.Status}
}
