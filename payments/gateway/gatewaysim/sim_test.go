package gatewaysim_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"go.uber.org/goleak"

	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
	"pitlane/payments/gateway/webhooksig"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const apiKey = "sk_sim"

var epoch = time.Date(2025, 11, 30, 8, 0, 0, 0, time.UTC)

// env is one simulator behind a real HTTP server.
type env struct {
	sim *gatewaysim.Sim
	url string
	hc  *http.Client
}

func start(t *testing.T, opts gatewaysim.Options) *env {
	t.Helper()
	if opts.APIKey == "" {
		opts.APIKey = apiKey
	}
	sim := gatewaysim.New(opts)
	srv := httptest.NewServer(sim)
	hc := &http.Client{
		Transport:     http.DefaultTransport.(*http.Transport).Clone(),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	// Cleanups run last-in first-out: the simulator closes first (releasing parked calls),
	// then the server waits for its handlers, then idle client connections go.
	t.Cleanup(hc.CloseIdleConnections)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = sim.Close() })
	return &env{sim: sim, url: srv.URL, hc: hc}
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	err    error // transport error: no answer
}

func (e *env) call(ctx context.Context, method, path, key, body string) answer {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{err: err}
	}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

func (e *env) register(t *testing.T, key, ref string) answer {
	t.Helper()
	return e.call(context.Background(), "POST", "/v1/payments", key,
		fmt.Sprintf(`{"amount":1999,"currency":"EUR","reference":%q,"return_url":"https://shop.example/back?o=1"}`, ref))
}

func (e *env) mustRegister(t *testing.T, key, ref string) string {
	t.Helper()
	a := e.register(t, key, ref)
	if a.err != nil || a.status != http.StatusCreated {
		t.Fatalf("register: %d %v %v", a.status, a.body, a.err)
	}
	return a.body["id"].(string)
}

func (e *env) statusOf(t *testing.T, id string) string {
	t.Helper()
	a := e.call(context.Background(), "GET", "/v1/payments/"+id, "", "")
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("GET %s: %d %v %v", id, a.status, a.body, a.err)
	}
	return a.body["status"].(string)
}

func TestCaptureAfterDelayAndExpiryFollowTheClock(t *testing.T) {
	t.Parallel()
	clock := payments.NewManualClock(epoch)
	e := start(t, gatewaysim.Options{Now: clock.Now, CaptureDelay: time.Minute, ExpireAfter: 10 * time.Minute})

	approved := e.mustRegister(t, "k1", "ref-1")
	untouched := e.mustRegister(t, "k2", "ref-2")
	if _, err := e.sim.Approve(approved); err != nil {
		t.Fatal(err)
	}
	if got := e.statusOf(t, approved); got != "authorized" {
		t.Fatalf("right after approval: %s, want authorized", got)
	}
	clock.Advance(time.Minute - time.Second)
	if got := e.statusOf(t, approved); got != "authorized" {
		t.Fatalf("before the capture delay: %s", got)
	}
	clock.Advance(time.Second)
	if got := e.statusOf(t, approved); got != "succeeded" {
		t.Fatalf("after the capture delay: %s, want succeeded (read lazily)", got)
	}

	if got := e.statusOf(t, untouched); got != "pending" {
		t.Fatalf("untouched before expiry: %s", got)
	}
	clock.Advance(9 * time.Minute)
	e.sim.Tick()
	if p, _ := e.sim.Payment(untouched); p.Status != "expired" {
		t.Fatalf("untouched after 10 min: %s, want expired", p.Status)
	}
	if _, err := e.sim.Approve(untouched); err == nil {
		t.Fatal("approving an expired payment succeeded")
	}
}

func TestZeroCaptureDelayCapturesAtOnce(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{})
	id := e.mustRegister(t, "k", "ref")
	p, err := e.sim.Approve(id)
	if err != nil || p.Status != "succeeded" {
		t.Fatalf("Approve = %s, %v; want succeeded at once", p.Status, err)
	}
}

// The hosted page shows an amount at its currency's ISO 4217 exponent, as pitlane's pages do: it
// kept a short table of its own, and 1999 HUF (pitlane: "19.99 HUF") read "1999 HUF", 1999 PYG
// read "19.99" (an outside review, money arithmetic). Negative control: the old table, HUF fails.
func TestHostedPageShowsTheAmountAtItsCurrencysExponent(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{CaptureDelay: time.Hour})
	for i, c := range []struct{ currency, want string }{
		{"EUR", "19.99 EUR"}, {"HUF", "19.99 HUF"}, {"JPY", "1999 JPY"}, {"PYG", "1999 PYG"}, {"KWD", "1.999 KWD"}, {"IQD", "1.999 IQD"}, {"CLF", "0.1999 CLF"},
	} {
		a := e.call(context.Background(), "POST", "/v1/payments", fmt.Sprintf("k-%d", i),
			fmt.Sprintf(`{"amount":1999,"currency":%q,"reference":"ref-%d","return_url":"https://shop.example/back"}`, c.currency, i))
		if a.err != nil || a.status != http.StatusCreated {
			t.Fatalf("register %s: %d %v %v", c.currency, a.status, a.body, a.err)
		}
		resp, err := e.hc.Get(e.url + "/pay/" + a.body["id"].(string))
		if err != nil {
			t.Fatal(err)
		}
		d, err := goquery.NewDocumentFromReader(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Find(`[data-testid=amount]`).Text(); got != c.want {
			t.Errorf("1999 %s on the hosted page: %q, want %q", c.currency, got, c.want)
		}
	}
}

func TestHostedPage(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{CaptureDelay: time.Hour, PublicURL: "http://gw.example:8090/"})
	id := e.mustRegister(t, "k", "order-42")
	p, _ := e.sim.Payment(id)
	if p.ConfirmationURL != "http://gw.example:8090/pay/"+id {
		t.Fatalf("confirmation_url %q does not use PublicURL", p.ConfirmationURL)
	}

	doc := func() *goquery.Document {
		t.Helper()
		resp, err := e.hc.Get(e.url + "/pay/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /pay: %d", resp.StatusCode)
		}
		d, err := goquery.NewDocumentFromReader(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := doc()
	if got := d.Find(`[data-testid=amount]`).Text(); got != "19.99 EUR" {
		t.Errorf("amount %q", got)
	}
	if got := d.Find(`[data-testid=reference]`).Text(); got != "order-42" {
		t.Errorf("reference %q", got)
	}
	for _, action := range []string{"approve", "decline"} {
		form := d.Find(`[data-testid=` + action + `]`).Closest("form")
		if m, _ := form.Attr("method"); m != "post" {
			t.Errorf("%s form method %q", action, m)
		}
		if a, _ := form.Attr("action"); a != "/pay/"+id+"/"+action {
			t.Errorf("%s form action %q", action, a)
		}
	}

	post := func(path string) *http.Response {
		t.Helper()
		resp, err := e.hc.Post(e.url+path, "application/x-www-form-urlencoded", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := post("/pay/" + id + "/approve")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "https://shop.example/back?o=1" {
		t.Fatalf("approve: %d to %q, want 303 to the return_url", resp.StatusCode, resp.Header.Get("Location"))
	}
	if got := e.statusOf(t, id); got != "authorized" {
		t.Fatalf("after Approve: %s", got)
	}
	// A second click sends the customer back again and changes nothing.
	if resp := post("/pay/" + id + "/decline"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("second click: %d", resp.StatusCode)
	}
	if got := e.statusOf(t, id); got != "authorized" {
		t.Fatalf("after a late Decline: %s", got)
	}
	if d := doc(); d.Find(`[data-testid=approve]`).Length() != 0 || d.Find(`[data-testid=return]`).Length() != 1 {
		t.Error("a decided payment still shows the buttons, or no way back to the shop")
	}

	declined := e.mustRegister(t, "k2", "order-43")
	post("/pay/" + declined + "/decline")
	a := e.call(context.Background(), "GET", "/v1/payments/"+declined, "", "")
	if a.body["status"] != "declined" || a.body["decline_code"] != gatewaysim.DefaultDeclineCode {
		t.Fatalf("declined payment: %v", a.body)
	}
	if resp := post("/pay/gp_nope/approve"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("approve unknown: %d", resp.StatusCode)
	}
}

func TestDroppedAnswerWasProcessed(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{})
	e.sim.DropNext(gatewaysim.OpRegister, 1)

	lost := e.register(t, "k", "ref")
	if lost.err == nil {
		t.Fatalf("dropped answer arrived: %d %v", lost.status, lost.body)
	}
	if got := e.sim.PaymentsByReference("ref"); len(got) != 1 {
		t.Fatalf("payments after a dropped answer: %d, want 1 (processed, answer lost)", len(got))
	}
	again := e.register(t, "k", "ref")
	if again.err != nil || again.status != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat: %d %v %v", again.status, again.header, again.err)
	}
	if again.body["id"] != e.sim.PaymentsByReference("ref")[0].ID {
		t.Fatal("repeat answered another payment")
	}
	if n := e.sim.KeyCallCount("k"); n != 2 {
		t.Fatalf("calls with key k: %d, want 2", n)
	}
}

func TestInjected5xxIsNotProcessed(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{})
	e.sim.FailNext(gatewaysim.OpRegister, 2)
	for i := range 2 {
		if a := e.register(t, "k", "ref"); a.status != http.StatusServiceUnavailable {
			t.Fatalf("call %d: %d, want 503", i, a.status)
		}
	}
	if got := e.sim.PaymentsByReference("ref"); len(got) != 0 {
		t.Fatalf("a 5xx before processing created %d payments", len(got))
	}
	if a := e.register(t, "k", "ref"); a.status != http.StatusCreated {
		t.Fatalf("after the failures: %d, want 201 (the key was never taken)", a.status)
	}

	_ = e.sim.SetFaults(gatewaysim.OpStatus, gatewaysim.Faults{ErrorRate: 1})
	if a := e.call(context.Background(), "GET", "/v1/payments/x", "", ""); a.status != http.StatusServiceUnavailable {
		t.Fatalf("error rate 1: %d", a.status)
	}
	_ = e.sim.SetFaults(gatewaysim.OpStatus, gatewaysim.Faults{})
	if a := e.call(context.Background(), "GET", "/v1/payments/x", "", ""); a.status != http.StatusNotFound {
		t.Fatalf("faults cleared: %d", a.status)
	}
	if err := e.sim.SetFaults("nope", gatewaysim.Faults{}); err == nil {
		t.Fatal("unknown op accepted")
	}
}

func TestLatencyHoldsTheKey(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{})
	_ = e.sim.SetFaults(gatewaysim.OpRegister, gatewaysim.Faults{Latency: time.Millisecond})
	if a := e.register(t, "k", "ref"); a.status != http.StatusCreated {
		t.Fatalf("with latency: %d", a.status)
	}
	// Close while a call waits out its latency: it answers 503 instead of hanging.
	_ = e.sim.SetFaults(gatewaysim.OpRegister, gatewaysim.Faults{Latency: time.Hour})
	done := make(chan answer, 1)
	go func() { done <- e.register(t, "k2", "ref") }()
	if err := e.sim.WaitCalls(context.Background(), gatewaysim.OpRegister, 2); err != nil {
		t.Fatal(err)
	}
	_ = e.sim.Close()
	if a := <-done; a.status != http.StatusServiceUnavailable {
		t.Fatalf("call during Close: %d %v", a.status, a.err)
	}
}

func TestPauseParksAndReleases(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := e.sim.Pause(gatewaysim.OpRegister); err != nil {
		t.Fatal(err)
	}
	first := make(chan answer, 1)
	go func() { first <- e.register(t, "k", "ref") }()
	if err := e.sim.WaitParked(ctx, gatewaysim.OpRegister, 1); err != nil {
		t.Fatal(err)
	}
	if a := e.register(t, "k", "ref"); a.status != http.StatusConflict || a.body["error"] != "idempotency_key_in_use" {
		t.Fatalf("same key while parked: %d %v", a.status, a.body)
	}
	if a := e.register(t, "k", "other-ref"); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body, while parked: %d %v", a.status, a.body)
	}
	// Other operations are not paused.
	if a := e.call(ctx, "GET", "/v1/payments?reference=ref", "", ""); a.status != http.StatusOK {
		t.Fatalf("find while register is paused: %d", a.status)
	}
	e.sim.Release(gatewaysim.OpRegister)
	if a := <-first; a.status != http.StatusCreated {
		t.Fatalf("released call: %d %v", a.status, a.err)
	}
	if err := e.sim.WaitIdle(ctx, gatewaysim.OpRegister); err != nil {
		t.Fatal(err)
	}
	if a := e.register(t, "k", "ref"); a.status != http.StatusOK {
		t.Fatalf("after release: %d, want a 200 replay", a.status)
	}

	// Close releases a parked call, which answers 503 unprocessed.
	_ = e.sim.Pause(gatewaysim.OpReverse)
	parked := make(chan answer, 1)
	go func() { parked <- e.call(context.Background(), "POST", "/v1/payments/gp_x/reverse", "rk", "") }()
	if err := e.sim.WaitParked(ctx, gatewaysim.OpReverse, 1); err != nil {
		t.Fatal(err)
	}
	_ = e.sim.Close()
	if a := <-parked; a.status != http.StatusServiceUnavailable {
		t.Fatalf("parked call at Close: %d %v", a.status, a.err)
	}
}

func TestIgnoreIdempotencyKeys(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{})
	e.sim.SetIgnoreIdempotencyKeys(true)
	for range 2 {
		if a := e.register(t, "k", "ref"); a.status != http.StatusCreated {
			t.Fatalf("keys ignored: %d", a.status)
		}
	}
	if n := len(e.sim.PaymentsByReference("ref")); n != 2 {
		t.Fatalf("keys ignored: %d payments, want 2", n)
	}
	e.sim.SetIgnoreIdempotencyKeys(false)
	e.register(t, "k2", "ref")
	if a := e.register(t, "k2", "ref"); a.status != http.StatusOK {
		t.Fatalf("keys honoured again: %d", a.status)
	}
}

func TestCallCountsAndReset(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{})
	id := e.mustRegister(t, "k", "ref")
	e.register(t, "k", "ref")
	e.statusOf(t, id)
	e.call(context.Background(), "POST", "/v1/payments/"+id+"/reverse", "rk", "")
	req, _ := http.NewRequest("GET", e.url+"/v1/payments/"+id, nil) // no auth: still counted
	if resp, err := e.hc.Do(req); err == nil {
		resp.Body.Close()
	}

	c := e.sim.Calls()
	want := map[gatewaysim.Op]int{gatewaysim.OpRegister: 2, gatewaysim.OpStatus: 2, gatewaysim.OpReverse: 1}
	for op, n := range want {
		if c.Ops[op] != n {
			t.Errorf("calls of %s: %d, want %d", op, c.Ops[op], n)
		}
	}
	if c.Keys["k"] != 2 || c.Keys["rk"] != 1 {
		t.Errorf("key calls %v", c.Keys)
	}

	e.sim.SetIgnoreIdempotencyKeys(true)
	e.sim.FailNext(gatewaysim.OpStatus, 5)
	e.sim.Reset()
	if len(e.sim.Payments()) != 0 || e.sim.CallCount(gatewaysim.OpRegister) != 0 || e.sim.Faults(gatewaysim.OpStatus) != (gatewaysim.Faults{}) {
		t.Fatal("Reset left state behind")
	}
	e.mustRegister(t, "k", "ref")
	if a := e.register(t, "k", "ref"); a.status != http.StatusOK {
		t.Fatalf("after Reset keys are honoured again: %d", a.status)
	}
}

// ---- webhooks ----

type event struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
	Data    struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	} `json:"data"`
}

// receiver is a webhook endpoint that verifies every delivery like pitlane's receiver must.
type receiver struct {
	url    string
	events chan event
	// answer, if set, picks the HTTP status for the n-th delivery (from 1).
	mu     sync.Mutex
	n      int
	answer func(n int) int
}

func newReceiver(t *testing.T, secret string, now func() time.Time) *receiver {
	t.Helper()
	rc := &receiver{events: make(chan event, 100)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhooksig.Verify(r.Header.Get(webhooksig.Header), body, [][]byte{[]byte(secret)}, now(), 0); err != nil {
			t.Errorf("webhook signature: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.n++
		n := rc.n
		rc.mu.Unlock()
		if rc.answer != nil {
			if code := rc.answer(n); code != http.StatusOK {
				w.WriteHeader(code)
				return
			}
		}
		var ev event
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("webhook body: %v", err)
		}
		rc.events <- ev
	}))
	t.Cleanup(srv.Close)
	rc.url = srv.URL
	return rc
}

func (rc *receiver) next(t *testing.T) event {
	t.Helper()
	select {
	case ev := <-rc.events:
		return ev
	case <-time.After(10 * time.Second): // a bound on a hang, not a wait for an event
		t.Fatal("no webhook arrived")
		return event{}
	}
}

func webhookEnv(t *testing.T, rc func(now func() time.Time) *receiver, opts gatewaysim.Options) (*env, *receiver) {
	t.Helper()
	clock := payments.NewManualClock(epoch)
	r := rc(clock.Now)
	opts.Now, opts.WebhookURL, opts.WebhookSecret = clock.Now, r.url, "whsec_test"
	if opts.WebhookBackoff == 0 {
		opts.WebhookBackoff = time.Millisecond
	}
	return start(t, opts), r
}

func TestWebhooksAreSignedAndInOrder(t *testing.T) {
	t.Parallel()
	e, rc := webhookEnv(t, func(now func() time.Time) *receiver { return newReceiver(t, "whsec_test", now) }, gatewaysim.Options{})
	id := e.mustRegister(t, "k", "ref")
	if _, err := e.sim.Approve(id); err != nil {
		t.Fatal(err)
	}
	first, second := rc.next(t), rc.next(t)
	if first.Type != "payment.updated" || first.Data.ID != id || first.Data.Status != "authorized" || first.Created != epoch.Unix() {
		t.Errorf("first event %+v", first)
	}
	if second.Data.Status != "succeeded" || second.ID == first.ID {
		t.Errorf("second event %+v", second)
	}
	if err := e.sim.WebhooksIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := e.sim.Deliveries(); len(d) != 2 || d[0].HTTPStatus != 200 || d[1].EventID != second.ID {
		t.Errorf("delivery log %+v", d)
	}
}

func TestWebhooksDuplicatedAndReordered(t *testing.T) {
	t.Parallel()
	e, rc := webhookEnv(t, func(now func() time.Time) *receiver { return newReceiver(t, "whsec_test", now) }, gatewaysim.Options{})
	e.sim.SetWebhookFaults(gatewaysim.WebhookFaults{Duplicate: 1, Reorder: true, Delay: time.Millisecond})
	id := e.mustRegister(t, "k", "ref")
	if _, err := e.sim.Approve(id); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 4 {
		ev := rc.next(t)
		got = append(got, ev.Data.Status+"/"+ev.ID)
	}
	if !strings.HasPrefix(got[0], "succeeded/") || got[0] != got[1] || !strings.HasPrefix(got[2], "authorized/") || got[2] != got[3] {
		t.Fatalf("deliveries %v, want succeeded twice (same id), then authorized twice", got)
	}

	// Reorder holds a payment's events until it is final; FlushHeldWebhooks lets them go.
	other := e.mustRegister(t, "k2", "ref2")
	e.sim.SetWebhookFaults(gatewaysim.WebhookFaults{Reorder: true})
	_, _ = e.sim.Approve(other) // capture delay 0: authorized and succeeded at once, both final-released
	a, b := rc.next(t), rc.next(t)
	if a.Data.Status != "succeeded" || b.Data.Status != "authorized" {
		t.Fatalf("reordered: %s then %s", a.Data.Status, b.Data.Status)
	}
}

func TestWebhooksRetryFailedDeliveries(t *testing.T) {
	t.Parallel()
	e, rc := webhookEnv(t, func(now func() time.Time) *receiver {
		r := newReceiver(t, "whsec_test", now)
		r.answer = func(n int) int {
			if n == 1 {
				return http.StatusInternalServerError
			}
			return http.StatusOK
		}
		return r
	}, gatewaysim.Options{CaptureDelay: time.Hour})
	id := e.mustRegister(t, "k", "ref")
	_, _ = e.sim.Approve(id)
	if ev := rc.next(t); ev.Data.Status != "authorized" {
		t.Fatalf("event %+v", ev)
	}
	if err := e.sim.WebhooksIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	d := e.sim.Deliveries()
	if len(d) != 2 || d[0].HTTPStatus != 500 || d[0].Error == "" || d[1].Attempt != 2 || d[1].HTTPStatus != 200 || d[0].EventID != d[1].EventID {
		t.Fatalf("delivery log %+v, want a failed first attempt and a successful second", d)
	}
}

func TestWebhookAttemptsAreBounded(t *testing.T) {
	t.Parallel()
	e, _ := webhookEnv(t, func(now func() time.Time) *receiver {
		r := newReceiver(t, "whsec_test", now)
		r.answer = func(int) int { return http.StatusServiceUnavailable }
		return r
	}, gatewaysim.Options{CaptureDelay: time.Hour, WebhookAttempts: 3})
	_, _ = e.sim.Approve(e.mustRegister(t, "k", "ref"))
	if err := e.sim.WebhooksIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := e.sim.Deliveries(); len(d) != 3 {
		t.Fatalf("%d attempts, want 3", len(d))
	}
}

func TestCloseAbortsAStuckDelivery(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // net/http notices a client hanging up only once the body is read
		close(arrived)
		<-r.Context().Done() // the receiver hangs until the sender gives up
	}))
	defer stuck.Close()
	sim := gatewaysim.New(gatewaysim.Options{WebhookURL: stuck.URL, WebhookSecret: "s", CaptureDelay: time.Hour})
	srv := httptest.NewServer(sim)
	defer srv.Close()
	e := &env{sim: sim, url: srv.URL, hc: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
	defer e.hc.CloseIdleConnections()
	_, _ = sim.Approve(e.mustRegister(t, "k", "ref"))
	<-arrived
	_ = sim.Close() // must return although the receiver never answers; goleak checks the rest
}

// ---- control API over HTTP ----

func TestControlAPI(t *testing.T) {
	t.Parallel()
	e := start(t, gatewaysim.Options{CaptureDelay: time.Hour})
	rc := gatewaysim.NewRemote(e.url, e.hc)
	ctx := context.Background()

	if err := rc.SetFaults(ctx, gatewaysim.OpRegister, gatewaysim.Faults{FailNext: 1, Latency: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if f := e.sim.Faults(gatewaysim.OpRegister); f.FailNext != 1 || f.Latency != 5*time.Millisecond {
		t.Fatalf("faults over HTTP: %+v", f)
	}
	if err := rc.SetFaults(ctx, "all", gatewaysim.Faults{}); err != nil {
		t.Fatal(err)
	}
	if err := rc.SetFaults(ctx, "bogus", gatewaysim.Faults{}); err == nil {
		t.Fatal("unknown op accepted")
	}
	if err := rc.SetIgnoreIdempotencyKeys(ctx, true); err != nil {
		t.Fatal(err)
	}
	st, err := rc.State(ctx)
	if err != nil || !st.IgnoreIdempotencyKeys || len(st.Faults) != 0 {
		t.Fatalf("state %+v %v", st, err)
	}
	_ = rc.SetIgnoreIdempotencyKeys(ctx, false)

	id := e.mustRegister(t, "k", "ref")
	if err := rc.Approve(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := rc.Approve(ctx, id); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("approve twice: %v", err)
	}
	if err := rc.Succeed(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := rc.Expire(ctx, "gp_nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("expire unknown: %v", err)
	}
	d := e.mustRegister(t, "k2", "ref")
	if err := rc.Decline(ctx, d, "insufficient_funds"); err != nil {
		t.Fatal(err)
	}
	list, err := rc.Payments(ctx, "ref")
	if err != nil || len(list) != 2 || list[0].ID != d || *list[0].DeclineCode != "insufficient_funds" || list[1].Status != "succeeded" {
		t.Fatalf("payments %+v %v", list, err)
	}
	calls, err := rc.Calls(ctx)
	if err != nil || calls.Ops[gatewaysim.OpRegister] != 2 || calls.Keys["k2"] != 1 {
		t.Fatalf("calls %+v %v", calls, err)
	}
	if err := rc.Tick(ctx); err != nil {
		t.Fatal(err)
	}

	if err := rc.Pause(ctx, gatewaysim.OpStatus); err != nil {
		t.Fatal(err)
	}
	done := make(chan answer, 1)
	go func() { done <- e.call(ctx, "GET", "/v1/payments/"+id, "", "") }()
	if err := rc.WaitParked(ctx, gatewaysim.OpStatus, 1); err != nil {
		t.Fatal(err)
	}
	if st, _ := rc.State(ctx); st.Parked[gatewaysim.OpStatus] != 1 || len(st.Paused) != 1 {
		t.Fatalf("state while parked %+v", st)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := rc.WaitParked(short, gatewaysim.OpStatus, 2); err == nil {
		t.Fatal("waiting for a second parked call returned without one")
	}
	cancel()
	if err := rc.Release(ctx, gatewaysim.OpStatus); err != nil {
		t.Fatal(err)
	}
	if a := <-done; a.status != http.StatusOK {
		t.Fatalf("released: %d", a.status)
	}
	if err := rc.WaitIdle(ctx, gatewaysim.OpStatus); err != nil {
		t.Fatal(err)
	}

	if err := rc.SetWebhookFaults(ctx, gatewaysim.WebhookFaults{Duplicate: 2}); err != nil {
		t.Fatal(err)
	}
	if err := rc.WebhooksIdle(ctx); err != nil { // no WebhookURL: idle at once
		t.Fatal(err)
	}
	if _, err := rc.Deliveries(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.FlushHeldWebhooks(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if list, _ := rc.Payments(ctx, ""); len(list) != 0 {
		t.Fatalf("after reset: %d payments", len(list))
	}
}

// ---- the command ----

func TestMainServesUntilCanceled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		errc <- gatewaysim.Main(ctx, []string{"--addr", "127.0.0.1:0", "--api-key", "k_main", "--tick", "1ms"}, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no listening line: %v", err)
	}
	base := strings.TrimSpace(line[strings.Index(line, "http://"):])
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequest("POST", base+"/v1/payments", strings.NewReader(`{"amount":100,"currency":"EUR","reference":"r"}`))
	req.Header.Set("Authorization", "Bearer k_main")
	req.Header.Set("Idempotency-Key", "k")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("register against Main: %d", resp.StatusCode)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Main after cancel: %v", err)
	}
}

func TestMainRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"--webhook-url", "http://x", "--webhook-secret", ""},
		{"extra"},
		// Webhook faults with no webhooks to shape were dropped without a word (audit 7).
		{"--webhook-duplicate", "2"},
		{"--webhook-delay", "1s"},
		{"--webhook-reorder"},
		{"--webhook-url", "http://x", "--webhook-secret", "s", "--webhook-duplicate", "-1"},
	} {
		// Canceled already: a Main that accepts its flags listens and returns nil at once
		// instead of serving until the test times out.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := gatewaysim.Main(ctx, append([]string{"--addr", "127.0.0.1:0"}, args...), io.Discard, io.Discard); err == nil {
			t.Errorf("Main(%q) accepted", args)
		}
	}
}

// The simulator's control API has no auth: by default it listens on loopback only, and
// listening on every interface is the operator's explicit --addr.
func TestMainListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	var usage strings.Builder
	if err := gatewaysim.Main(context.Background(), []string{"-h"}, io.Discard, &usage); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(usage.String(), `(default "127.0.0.1:8090")`) {
		t.Fatalf("the default address is not loopback:\n%s", usage.String())
	}
}
