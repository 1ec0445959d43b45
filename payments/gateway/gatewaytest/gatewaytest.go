// Package gatewaytest is the contract suite of the reference gateway API
// (shared/contracts/gateway-api.md): Run checks that a server claiming the contract honours it,
// over plain HTTP, without pitlane's client in between (so a client bug cannot hide a server
// bug). pitlane's simulator runs it in its tests; point it at any other implementation the same
// way.
//
// The customer side of a payment (approve, decline, capture, expiry) cannot be reached through
// the merchant API, so the rules that need it take hooks in Controls; a subtest whose hook is nil
// is skipped with a message naming it.
package gatewaytest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Target is a server under test.
type Target struct {
	// BaseURL is the gateway's base URL (GATEWAY_URL).
	BaseURL string
	// APIKey is a valid bearer key.
	APIKey string
	// HTTPClient is used for every request; nil means a private client.
	HTTPClient *http.Client
	// Controls drive the customer side; optional.
	Controls Controls
}

// Controls are the hooks the suite needs for rules the merchant API cannot reach.
type Controls struct {
	// Succeed makes a pending payment succeed (approved and captured).
	Succeed func(ctx context.Context, paymentID string) error
	// Decline makes a pending payment declined.
	Decline func(ctx context.Context, paymentID string) error
	// Expire makes a pending payment expired.
	Expire func(ctx context.Context, paymentID string) error
	// HoldRegister makes register calls stay in flight inside the server (after their key was
	// taken) until release; parked returns once n calls are held.
	HoldRegister func(ctx context.Context) (parked func(ctx context.Context, n int) error, release func(ctx context.Context) error, err error)
}

// Run runs the contract suite against target. It needs the target to itself while it runs
// (HoldRegister holds every register call), and leaves payments behind.
func Run(t *testing.T, target Target) {
	t.Helper()
	hc := target.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		t.Cleanup(hc.CloseIdleConnections)
	}
	g := &gw{base: strings.TrimRight(target.BaseURL, "/"), key: target.APIKey, hc: hc, ctl: target.Controls}

	// Subtests that hold server-wide state (a paused operation) run first, alone; everything
	// else runs in parallel afterwards.
	t.Run("a key in flight answers 409 idempotency_key_in_use", g.inFlight)

	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"register answers 201 with a pending payment object", g.register},
		{"same key and body replays with 200 and Idempotent-Replayed", g.replay},
		{"same key with another body is 422 idempotency_key_reused", g.keyReused},
		{"a key is not shared across operations", g.keyAcrossOps},
		{"get returns the payment, 404 not_found for an unknown id", g.get},
		{"search by reference lists newest first, only that reference", g.search},
		{"search for an unused reference is an empty list", g.searchEmpty},
		{"reverse a pending payment, again with the same key", g.reversePending},
		{"reverse a succeeded, declined or expired payment is 409 not_reversible", g.reverseFinal},
		{"reverse of an unknown payment is 404", g.reverseUnknown},
		{"refund before success is 409 not_refundable", g.refundNotSucceeded},
		{"refunds: partial, replay, over the remainder, read back", g.refunds},
		{"refund of an unknown payment is 404, unknown refund is 404", g.refundUnknown},
		{"401 unauthorized without or with a wrong key", g.unauthorized},
		{"400 invalid_request for malformed requests", g.invalid},
		{"unknown request fields are ignored", g.unknownFields},
		{"the hosted page answers at confirmation_url", g.hostedPage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t)
		})
	}
}

// ---- plumbing ----

type gw struct {
	base, key string
	hc        *http.Client
	ctl       Controls
}

type resp struct {
	status int
	header http.Header
	raw    []byte
}

func (r resp) obj(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.raw, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %v\n%s", err, r.raw)
	}
	return m
}

func (r resp) errorCode(t *testing.T) string {
	t.Helper()
	code, _ := r.obj(t)["error"].(string)
	return code
}

type req struct {
	method, path string
	key          string // Idempotency-Key; "" = none
	body         string // raw JSON; "" = none
	auth         *string
}

func (g *gw) do(t *testing.T, rq req) resp {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return g.doCtx(ctx, t, rq)
}

func (g *gw) doCtx(ctx context.Context, t *testing.T, rq req) resp {
	t.Helper()
	var body io.Reader
	if rq.body != "" {
		body = strings.NewReader(rq.body)
	}
	target := rq.path
	if !strings.HasPrefix(target, "http") {
		target = g.base + rq.path
	}
	r, err := http.NewRequestWithContext(ctx, rq.method, target, body)
	if err != nil {
		t.Fatal(err)
	}
	if rq.auth != nil {
		if *rq.auth != "" {
			r.Header.Set("Authorization", *rq.auth)
		}
	} else {
		r.Header.Set("Authorization", "Bearer "+g.key)
	}
	if rq.body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	if rq.key != "" {
		r.Header.Set("Idempotency-Key", rq.key)
	}
	res, err := g.hc.Do(r)
	if err != nil {
		t.Fatalf("%s %s: %v", rq.method, rq.path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		t.Fatalf("%s %s: read answer: %v", rq.method, rq.path, err)
	}
	return resp{status: res.StatusCode, header: res.Header, raw: raw}
}

func expect(t *testing.T, r resp, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("HTTP %d, want %d\n%s", r.status, status, r.raw)
	}
	if code != "" {
		if got := r.errorCode(t); got != code {
			t.Fatalf("error %q, want %q\n%s", got, code, r.raw)
		}
	}
}

func unique(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

type payment struct {
	ID              string  `json:"id"`
	Status          string  `json:"status"`
	Amount          int64   `json:"amount"`
	Currency        string  `json:"currency"`
	Reference       string  `json:"reference"`
	ConfirmationURL string  `json:"confirmation_url"`
	Created         int64   `json:"created"`
	DeclineCode     *string `json:"decline_code"`
}

func (r resp) payment(t *testing.T) payment {
	t.Helper()
	var p payment
	if err := json.Unmarshal(r.raw, &p); err != nil {
		t.Fatalf("answer is not a payment object: %v\n%s", err, r.raw)
	}
	if p.ID == "" || p.Status == "" {
		t.Fatalf("payment object without id or status:\n%s", r.raw)
	}
	return p
}

type refund struct {
	ID        string `json:"id"`
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
	Status    string `json:"status"`
}

func (r resp) refund(t *testing.T) refund {
	t.Helper()
	var rf refund
	if err := json.Unmarshal(r.raw, &rf); err != nil || rf.ID == "" {
		t.Fatalf("answer is not a refund object (%v):\n%s", err, r.raw)
	}
	return rf
}

func registerBody(amount int64, currency, reference string) string {
	return fmt.Sprintf(`{"amount":%d,"currency":%q,"reference":%q,"return_url":"https://shop.example/return"}`, amount, currency, reference)
}

// newPayment registers a fresh pending payment.
func (g *gw) newPayment(t *testing.T, amount int64) payment {
	t.Helper()
	r := g.do(t, req{method: "POST", path: "/v1/payments", key: unique("k-"), body: registerBody(amount, "EUR", unique("ref-"))})
	expect(t, r, http.StatusCreated, "")
	return r.payment(t)
}

func (g *gw) need(t *testing.T, hook func(context.Context, string) error, name string) {
	t.Helper()
	if hook == nil {
		t.Skipf("Controls.%s is not set: this rule needs the customer side", name)
	}
}

func (g *gw) control(t *testing.T, f func(context.Context, string) error, name, id string) {
	t.Helper()
	g.need(t, f, name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f(ctx, id); err != nil {
		t.Fatalf("Controls.%s(%s): %v", name, id, err)
	}
}

func (g *gw) status(t *testing.T, id string) payment {
	t.Helper()
	r := g.do(t, req{method: "GET", path: "/v1/payments/" + url.PathEscape(id)})
	expect(t, r, http.StatusOK, "")
	return r.payment(t)
}

// ---- the rules ----

func (g *gw) register(t *testing.T) {
	ref := unique("ref-")
	before := time.Now().Add(-time.Hour).Unix()
	r := g.do(t, req{method: "POST", path: "/v1/payments", key: unique("k-"), body: registerBody(1999, "EUR", ref)})
	expect(t, r, http.StatusCreated, "")
	if r.header.Get("Idempotent-Replayed") == "true" {
		t.Error("a first request must not be marked as replayed")
	}
	p := r.payment(t)
	if p.Status != "pending" || p.Amount != 1999 || p.Currency != "EUR" || p.Reference != ref {
		t.Errorf("payment %+v, want pending 1999 EUR %s", p, ref)
	}
	if p.ConfirmationURL == "" {
		t.Error("confirmation_url is empty")
	}
	if p.Created < before {
		t.Errorf("created %d is not a recent unix time", p.Created)
	}
	if p.DeclineCode != nil {
		t.Errorf("decline_code %q on a pending payment", *p.DeclineCode)
	}
}

func (g *gw) replay(t *testing.T) {
	key, body := unique("k-"), registerBody(500, "EUR", unique("ref-"))
	first := g.do(t, req{method: "POST", path: "/v1/payments", key: key, body: body})
	expect(t, first, http.StatusCreated, "")
	again := g.do(t, req{method: "POST", path: "/v1/payments", key: key, body: body})
	expect(t, again, http.StatusOK, "")
	if got := again.header.Get("Idempotent-Replayed"); got != "true" {
		t.Errorf("Idempotent-Replayed = %q, want true", got)
	}
	if a, b := first.payment(t), again.payment(t); a.ID != b.ID {
		t.Errorf("replay returned payment %s, the first request created %s", b.ID, a.ID)
	}
}

func (g *gw) keyReused(t *testing.T) {
	key, ref := unique("k-"), unique("ref-")
	expect(t, g.do(t, req{method: "POST", path: "/v1/payments", key: key, body: registerBody(500, "EUR", ref)}), http.StatusCreated, "")
	for _, body := range []string{registerBody(501, "EUR", ref), registerBody(500, "USD", ref), registerBody(500, "EUR", ref+"x")} {
		expect(t, g.do(t, req{method: "POST", path: "/v1/payments", key: key, body: body}), http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
}

func (g *gw) keyAcrossOps(t *testing.T) {
	p := g.newPayment(t, 700)
	key := unique("k-")
	expect(t, g.do(t, req{method: "POST", path: "/v1/payments/" + p.ID + "/reverse", key: key}), http.StatusOK, "")
	// The same key for a registration asks for something else: refused, nothing created.
	ref := unique("ref-")
	expect(t, g.do(t, req{method: "POST", path: "/v1/payments", key: key, body: registerBody(700, "EUR", ref)}), http.StatusUnprocessableEntity, "idempotency_key_reused")
	if n := g.searchIDs(t, ref); len(n) != 0 {
		t.Errorf("a refused request created payments %v", n)
	}
}

func (g *gw) get(t *testing.T) {
	p := g.newPayment(t, 1234)
	got := g.status(t, p.ID)
	if got != p {
		t.Errorf("GET = %+v\nPOST = %+v", got, p)
	}
	expect(t, g.do(t, req{method: "GET", path: "/v1/payments/" + unique("gp_nope")}), http.StatusNotFound, "not_found")
}

func (g *gw) searchIDs(t *testing.T, ref string) []string {
	t.Helper()
	r := g.do(t, req{method: "GET", path: "/v1/payments?reference=" + url.QueryEscape(ref)})
	expect(t, r, http.StatusOK, "")
	var list struct {
		Data []payment `json:"data"`
	}
	if err := json.Unmarshal(r.raw, &list); err != nil || list.Data == nil {
		t.Fatalf("answer is not {\"data\":[…]} (%v):\n%s", err, r.raw)
	}
	ids := make([]string, len(list.Data))
	for i, p := range list.Data {
		if p.Reference != ref {
			t.Errorf("search for %q returned a payment with reference %q", ref, p.Reference)
		}
		ids[i] = p.ID
	}
	return ids
}

func (g *gw) search(t *testing.T) {
	ref, other := unique("ref-"), unique("ref-")
	var created []string
	for i := range 3 {
		r := g.do(t, req{method: "POST", path: "/v1/payments", key: unique("k-"), body: registerBody(int64(100+i), "EUR", ref)})
		expect(t, r, http.StatusCreated, "")
		created = append(created, r.payment(t).ID)
	}
	expect(t, g.do(t, req{method: "POST", path: "/v1/payments", key: unique("k-"), body: registerBody(100, "EUR", other)}), http.StatusCreated, "")
	got := g.searchIDs(t, ref)
	want := []string{created[2], created[1], created[0]}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("search = %v, want newest first %v", got, want)
	}
}

func (g *gw) searchEmpty(t *testing.T) {
	if ids := g.searchIDs(t, unique("ref-unused-")); len(ids) != 0 {
		t.Errorf("search for an unused reference = %v", ids)
	}
}

func (g *gw) reversePending(t *testing.T) {
	p := g.newPayment(t, 900)
	key := unique("k-")
	path := "/v1/payments/" + p.ID + "/reverse"
	first := g.do(t, req{method: "POST", path: path, key: key})
	expect(t, first, http.StatusOK, "")
	if got := first.payment(t); got.ID != p.ID || got.Status != "reversed" {
		t.Errorf("reverse = %+v, want %s reversed", got, p.ID)
	}
	again := g.do(t, req{method: "POST", path: path, key: key})
	expect(t, again, http.StatusOK, "")
	if got := again.payment(t); got.ID != p.ID || got.Status != "reversed" {
		t.Errorf("repeated reverse = %+v, want %s reversed", got, p.ID)
	}
	if got := g.status(t, p.ID); got.Status != "reversed" {
		t.Errorf("status after reverse = %s", got.Status)
	}
	expect(t, g.do(t, req{method: "POST", path: path}), http.StatusBadRequest, "invalid_request")
}

func (g *gw) reverseFinal(t *testing.T) {
	for _, tc := range []struct {
		status string
		hook   func(context.Context, string) error
		name   string
	}{
		{"succeeded", g.ctl.Succeed, "Succeed"},
		{"declined", g.ctl.Decline, "Decline"},
		{"expired", g.ctl.Expire, "Expire"},
	} {
		t.Run(tc.status, func(t *testing.T) {
			t.Parallel()
			p := g.newPayment(t, 1500)
			g.control(t, tc.hook, tc.name, p.ID)
			r := g.do(t, req{method: "POST", path: "/v1/payments/" + p.ID + "/reverse", key: unique("k-")})
			expect(t, r, http.StatusConflict, "not_reversible")
			if got, _ := r.obj(t)["status"].(string); got != tc.status {
				t.Errorf("not_reversible carries status %q, want %q", got, tc.status)
			}
			if got := g.status(t, p.ID); got.Status != tc.status {
				t.Errorf("status after a refused reverse = %s, want %s", got.Status, tc.status)
			}
			if tc.status == "declined" {
				if got := g.status(t, p.ID); got.DeclineCode == nil || *got.DeclineCode == "" {
					t.Error("a declined payment has no decline_code")
				}
			}
		})
	}
}

func (g *gw) reverseUnknown(t *testing.T) {
	expect(t, g.do(t, req{method: "POST", path: "/v1/payments/" + unique("gp_nope") + "/reverse", key: unique("k-")}), http.StatusNotFound, "not_found")
}

func (g *gw) refundNotSucceeded(t *testing.T) {
	p := g.newPayment(t, 1000)
	expect(t, g.do(t, req{method: "POST", path: "/v1/payments/" + p.ID + "/refunds", key: unique("k-"), body: `{"amount":100}`}),
		http.StatusConflict, "not_refundable")
}

func (g *gw) refunds(t *testing.T) {
	g.need(t, g.ctl.Succeed, "Succeed")
	p := g.newPayment(t, 1000)
	g.control(t, g.ctl.Succeed, "Succeed", p.ID)
	path := "/v1/payments/" + p.ID + "/refunds"

	key := unique("k-")
	first := g.do(t, req{method: "POST", path: path, key: key, body: `{"amount":600}`})
	expect(t, first, http.StatusCreated, "")
	rf := first.refund(t)
	if rf.PaymentID != p.ID || rf.Amount != 600 {
		t.Errorf("refund = %+v, want 600 of %s", rf, p.ID)
	}
	switch rf.Status {
	case "succeeded", "pending", "failed":
	default:
		t.Errorf("refund status %q is not succeeded|pending|failed", rf.Status)
	}
	again := g.do(t, req{method: "POST", path: path, key: key, body: `{"amount":600}`})
	expect(t, again, http.StatusOK, "")
	if got := again.refund(t); got.ID != rf.ID {
		t.Errorf("repeated refund created %s, first was %s", got.ID, rf.ID)
	}
	expect(t, g.do(t, req{method: "POST", path: path, key: key, body: `{"amount":601}`}), http.StatusUnprocessableEntity, "idempotency_key_reused")

	if rf.Status != "failed" {
		expect(t, g.do(t, req{method: "POST", path: path, key: unique("k-"), body: `{"amount":401}`}), http.StatusConflict, "amount_exceeds_remaining")
		rest := g.do(t, req{method: "POST", path: path, key: unique("k-"), body: `{"amount":400}`})
		expect(t, rest, http.StatusCreated, "")
		expect(t, g.do(t, req{method: "POST", path: path, key: unique("k-"), body: `{"amount":1}`}), http.StatusConflict, "amount_exceeds_remaining")
	}

	read := g.do(t, req{method: "GET", path: "/v1/refunds/" + url.PathEscape(rf.ID)})
	expect(t, read, http.StatusOK, "")
	if got := read.refund(t); got.ID != rf.ID || got.PaymentID != p.ID || got.Amount != 600 {
		t.Errorf("GET refund = %+v, want %+v", got, rf)
	}
}

func (g *gw) refundUnknown(t *testing.T) {
	expect(t, g.do(t, req{method: "POST", path: "/v1/payments/" + unique("gp_nope") + "/refunds", key: unique("k-"), body: `{"amount":1}`}),
		http.StatusNotFound, "not_found")
	r := g.do(t, req{method: "GET", path: "/v1/refunds/" + unique("rf_nope")})
	if r.status != http.StatusNotFound {
		t.Fatalf("GET unknown refund: HTTP %d, want 404\n%s", r.status, r.raw)
	}
}

func (g *gw) unauthorized(t *testing.T) {
	p := g.newPayment(t, 300)
	none, wrong, notBearer := "", "Bearer "+g.key+"x", "Basic "+g.key
	ref := unique("ref-")
	calls := []req{
		{method: "POST", path: "/v1/payments", key: unique("k-"), body: registerBody(300, "EUR", ref)},
		{method: "GET", path: "/v1/payments/" + p.ID},
		{method: "GET", path: "/v1/payments?reference=" + url.QueryEscape(p.Reference)},
		{method: "POST", path: "/v1/payments/" + p.ID + "/reverse", key: unique("k-")},
		{method: "POST", path: "/v1/payments/" + p.ID + "/refunds", key: unique("k-"), body: `{"amount":1}`},
		{method: "GET", path: "/v1/refunds/rf_x"},
	}
	for _, auth := range []*string{&none, &wrong, &notBearer} {
		for _, c := range calls {
			c.auth = auth
			r := g.do(t, c)
			if r.status != http.StatusUnauthorized || r.errorCode(t) != "unauthorized" {
				t.Errorf("%s %s with Authorization %q: HTTP %d %s, want 401 unauthorized", c.method, c.path, *auth, r.status, r.raw)
			}
		}
	}
	if ids := g.searchIDs(t, ref); len(ids) != 0 {
		t.Errorf("an unauthorized register created %v", ids)
	}
	if got := g.status(t, p.ID); got.Status != "pending" {
		t.Errorf("an unauthorized reverse changed the payment to %s", got.Status)
	}
}

func (g *gw) invalid(t *testing.T) {
	ref := unique("ref-")
	long := strings.Repeat("k", 65)
	for _, tc := range []struct {
		name string
		rq   req
	}{
		{"no Idempotency-Key", req{method: "POST", path: "/v1/payments", body: registerBody(100, "EUR", ref)}},
		{"Idempotency-Key of 65 characters", req{method: "POST", path: "/v1/payments", key: long, body: registerBody(100, "EUR", ref)}},
		{"body is not JSON", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: `{"amount":`}},
		{"body is not an object", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: `[1,2]`}},
		{"no amount", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: fmt.Sprintf(`{"currency":"EUR","reference":%q}`, ref)}},
		{"zero amount", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: registerBody(0, "EUR", ref)}},
		{"negative amount", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: registerBody(-5, "EUR", ref)}},
		{"fractional amount", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: fmt.Sprintf(`{"amount":19.99,"currency":"EUR","reference":%q}`, ref)}},
		{"amount as a string", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: fmt.Sprintf(`{"amount":"1999","currency":"EUR","reference":%q}`, ref)}},
		{"lower-case currency", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: registerBody(100, "eur", ref)}},
		{"no currency", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: fmt.Sprintf(`{"amount":100,"reference":%q}`, ref)}},
		{"no reference", req{method: "POST", path: "/v1/payments", key: unique("k-"), body: `{"amount":100,"currency":"EUR"}`}},
		{"reverse without Idempotency-Key", req{method: "POST", path: "/v1/payments/gp_x/reverse"}},
		{"refund without Idempotency-Key", req{method: "POST", path: "/v1/payments/gp_x/refunds", body: `{"amount":1}`}},
		{"refund without amount", req{method: "POST", path: "/v1/payments/gp_x/refunds", key: unique("k-"), body: `{}`}},
		{"refund of a negative amount", req{method: "POST", path: "/v1/payments/gp_x/refunds", key: unique("k-"), body: `{"amount":-1}`}},
	} {
		r := g.do(t, tc.rq)
		if r.status != http.StatusBadRequest || r.errorCode(t) != "invalid_request" {
			t.Errorf("%s: HTTP %d %s, want 400 invalid_request", tc.name, r.status, r.raw)
		}
	}
	if ids := g.searchIDs(t, ref); len(ids) != 0 {
		t.Errorf("invalid requests created payments %v", ids)
	}
}

func (g *gw) unknownFields(t *testing.T) {
	ref := unique("ref-")
	body := fmt.Sprintf(`{"amount":250,"currency":"EUR","reference":%q,"metadata":{"a":1},"future_field":[true],"description":"x"}`, ref)
	r := g.do(t, req{method: "POST", path: "/v1/payments", key: unique("k-"), body: body})
	expect(t, r, http.StatusCreated, "")
	if p := r.payment(t); p.Amount != 250 || p.Reference != ref {
		t.Errorf("payment %+v", p)
	}
	rv := g.do(t, req{method: "POST", path: "/v1/payments/" + r.payment(t).ID + "/reverse", key: unique("k-"), body: `{"reason":"customer asked","x":1}`})
	expect(t, rv, http.StatusOK, "")
}

func (g *gw) hostedPage(t *testing.T) {
	p := g.newPayment(t, 4200)
	r := g.do(t, req{method: "GET", path: p.ConfirmationURL, auth: new(string)})
	if r.status != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d", p.ConfirmationURL, r.status)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("hosted page Content-Type %q, want text/html", ct)
	}
	if !bytes.Contains(r.raw, []byte(p.ID)) && !bytes.Contains(r.raw, []byte("42")) {
		t.Errorf("hosted page mentions neither the payment nor its amount")
	}
}

// inFlight: while a request with a key is still being processed, a second one with the same
// key must not be processed (409); once the first finishes, the key replays its payment.
func (g *gw) inFlight(t *testing.T) {
	if g.ctl.HoldRegister == nil {
		t.Skip("Controls.HoldRegister is not set: this rule needs a request held in flight")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	parked, release, err := g.ctl.HoldRegister(ctx)
	if err != nil {
		t.Fatalf("HoldRegister: %v", err)
	}
	released := false
	defer func() {
		if !released {
			_ = release(context.Background())
		}
	}()

	key, ref := unique("k-"), unique("ref-")
	body := registerBody(800, "EUR", ref)
	firstDone := make(chan resp, 1)
	go func() {
		// Not g.do: t.Fatal must not be called off the test goroutine.
		firstDone <- g.rawDo(ctx, req{method: "POST", path: "/v1/payments", key: key, body: body})
	}()
	if err := parked(ctx, 1); err != nil {
		t.Fatalf("the first request was never held: %v", err)
	}

	// The second request must be refused at once. If the server takes it in instead, it is held
	// too: notice that (a second held call) rather than waiting for a timeout.
	secondDone := make(chan resp, 1)
	go func() { secondDone <- g.rawDo(ctx, req{method: "POST", path: "/v1/payments", key: key, body: body}) }()
	heldCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	held := make(chan error, 1)
	go func() { held <- parked(heldCtx, 2) }()
	select {
	case second := <-secondDone:
		stopWatching()
		expect(t, second, http.StatusConflict, "idempotency_key_in_use")
	case err := <-held:
		if err == nil {
			t.Fatal("a second request with the key in flight was taken in for processing instead of 409 idempotency_key_in_use")
		}
		t.Fatalf("watching for a second held request: %v", err)
	}

	if err := release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	released = true
	first := <-firstDone
	if first.status == 0 {
		t.Fatalf("the held request failed: %s", first.raw)
	}
	expect(t, first, http.StatusCreated, "")
	again := g.do(t, req{method: "POST", path: "/v1/payments", key: key, body: body})
	expect(t, again, http.StatusOK, "")
	if a, b := first.payment(t), again.payment(t); a.ID != b.ID {
		t.Errorf("after the held request finished, the key replays %s instead of %s", b.ID, a.ID)
	}
	if ids := g.searchIDs(t, ref); len(ids) != 1 {
		t.Errorf("payments for the reference: %v, want exactly one", ids)
	}
}

// rawDo is do without testing.T, for goroutines; a transport error comes back as status 0.
func (g *gw) rawDo(ctx context.Context, rq req) resp {
	r, err := http.NewRequestWithContext(ctx, rq.method, g.base+rq.path, strings.NewReader(rq.body))
	if err != nil {
		return resp{raw: []byte(err.Error())}
	}
	r.Header.Set("Authorization", "Bearer "+g.key)
	r.Header.Set("Content-Type", "application/json")
	if rq.key != "" {
		r.Header.Set("Idempotency-Key", rq.key)
	}
	res, err := g.hc.Do(r)
	if err != nil {
		return resp{raw: []byte(err.Error())}
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return resp{raw: []byte(err.Error())}
	}
	return resp{status: res.StatusCode, header: res.Header, raw: raw}
}
