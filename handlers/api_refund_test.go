package handlers_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// refund is the contract's refund object as a client reads it.
type refund struct {
	ID        string `json:"id"`
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
}

func refundsPath(paymentID string) string { return "/api/v1/payments/" + paymentID + "/refunds" }

// wantRefund asserts a status, the refund's Location, and returns the refund in the body.
func wantRefund(t *testing.T, rec *httptest.ResponseRecorder, status int) refund {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q", ct)
	}
	r := decode[refund](t, rec)
	if status != http.StatusOK {
		if loc := rec.Header().Get("Location"); loc != "/api/v1/refunds/"+r.ID {
			t.Fatalf("Location = %q, refund %s", loc, r.ID)
		}
	}
	return r
}

// completedPayment makes a payment through the API and has the gateway capture it.
func (b *apiBench) completedPayment(t *testing.T, order string, amount int64) payment {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"amount": amount, "currency": "EUR"})
	p := wantPayment(t, b.do(post(createPath(order), string(body))), http.StatusCreated)
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)
	if p = wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", "")), http.StatusOK); p.Status != "Completed" {
		t.Fatalf("setup: payment %+v", p)
	}
	return p
}

func (b *apiBench) refunds(t *testing.T) int { return b.count(t, `SELECT count(*) FROM refunds`) }

func TestAPIRefundStatuses(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-refund", 1000)

	// 201: the gateway confirmed; exactly the contract's fields; GET reads it back.
	rec := b.do(post(refundsPath(p.ID), `{"amount":600}`))
	r := wantRefund(t, rec, http.StatusCreated)
	if r.PaymentID != p.ID || r.Amount != 600 || r.Status != "Succeeded" || r.ID == "" {
		t.Fatalf("refund %+v", r)
	}
	if _, err := time.Parse(time.RFC3339Nano, r.CreatedAt); err != nil {
		t.Fatalf("created_at %q: %v", r.CreatedAt, err)
	}
	var fields map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &fields); err != nil {
		t.Fatal(err)
	}
	var names []string
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	if got := strings.Join(names, ","); got != "amount,created_at,id,payment_id,status" {
		t.Fatalf("refund fields = %s", got)
	}
	if rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatal("a first request is not a replay")
	}
	if got := wantRefund(t, b.do(get("/api/v1/refunds/"+r.ID)), http.StatusOK); got != r {
		t.Fatalf("GET = %+v, want %+v", got, r)
	}
	// An upper-case spelling of the refund id is the same refund.
	if got := wantRefund(t, b.do(get("/api/v1/refunds/"+strings.ToUpper(r.ID))), http.StatusOK); got.ID != r.ID {
		t.Fatalf("GET upper-case = %+v", got)
	}

	// 409: 600 of 1000 refunded, 401 more would exceed; 400 fits.
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":401}`)), http.StatusConflict, "")
	wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":400}`, "Idempotency-Key", "rest")), http.StatusCreated)
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":1}`)), http.StatusConflict, "")

	// 409: the payment is not Completed.
	open := wantPayment(t, b.do(post(createPath("o-open"), `{"amount":1000,"currency":"EUR"}`)), http.StatusCreated)
	wantProblem(t, b.do(post(refundsPath(open.ID), `{"amount":100}`)), http.StatusConflict, "")

	// 422: the amount, before anything else is looked at.
	for _, body := range []string{`{"amount":0}`, `{"amount":-5}`, `{"amount":"100"}`, `{"amount":1.5}`, `{"amount":1e3}`,
		`{"amount":1000000000000}`, `{"amount":null}`, `{}`} {
		wantProblem(t, b.do(post(refundsPath(p.ID), body)), http.StatusUnprocessableEntity, "amount")
	}
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":1,"currency":"EUR"}`)), http.StatusUnprocessableEntity, "currency")
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":1,"amount":2}`)), http.StatusUnprocessableEntity, "amount")
	// 400 / 415: not JSON.
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":`)), http.StatusBadRequest, "")
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":1}`, "Content-Type", "text/plain")), http.StatusUnsupportedMediaType, "")

	// 404: no such payment (a UUID nobody has, or not an id at all) and no such refund.
	wantProblem(t, b.do(post(refundsPath("00000000-0000-0000-0000-000000000000"), `{"amount":100}`)), http.StatusNotFound, "")
	wantProblem(t, b.do(post(refundsPath("not-a-payment"), `{"amount":100}`, "Idempotency-Key", "k404")), http.StatusNotFound, "")
	wantProblem(t, b.do(get("/api/v1/refunds/00000000-0000-0000-0000-000000000000")), http.StatusNotFound, "")
	wantProblem(t, b.do(get("/api/v1/refunds/nope")), http.StatusNotFound, "")

	// 401 before anything.
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":1}`, "Authorization", "")), http.StatusUnauthorized, "")
	wantProblem(t, b.do(get("/api/v1/refunds/"+r.ID, "Authorization", "")), http.StatusUnauthorized, "")

	if n := b.refunds(t); n != 2 {
		t.Fatalf("refunds = %d, want 2", n)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 2 {
		t.Fatalf("gateway refunds = %d, want 2", n)
	}
	if n := b.count(t, `SELECT coalesce(sum(amount), 0)::int FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 1000 {
		t.Fatalf("refunded in the ledger = %d", n)
	}
}

// The gateway refuses: the answer is a 201 with a Failed refund (the gateway did answer), and a
// Failed refund does not count against the amount.
func TestAPIRefundFailedAtGatewayIs201(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-refused", 1000)
	b.gw.Fail(fakegw.OpRefund, fakegw.Definitive, 1)
	if r := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":1000}`)), http.StatusCreated); r.Status != "Failed" {
		t.Fatalf("refused refund = %+v", r)
	}
	if r := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":1000}`, "Idempotency-Key", "try-again")), http.StatusCreated); r.Status != "Succeeded" {
		t.Fatalf("second refund = %+v", r)
	}
}

// 202 when the gateway's answer is lost; the patrol settles it; the key's replay then tells the
// current state (Succeeded) with the first status (202) and Idempotent-Replayed. The same key
// with another body is 422 and changes nothing.
func TestAPIRefundPendingReplayShowsCurrentState(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-pending", 1000)
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1)
	c := post(refundsPath(p.ID), `{"amount":250}`, "Idempotency-Key", "refund-1")
	first := wantRefund(t, b.do(c), http.StatusAccepted)
	if first.Status != "Pending" || first.Amount != 250 {
		t.Fatalf("first = %+v", first)
	}
	if r := wantRefund(t, b.do(get("/api/v1/refunds/"+first.ID)), http.StatusOK); r.Status != "Pending" {
		t.Fatalf("GET before the patrol = %+v", r)
	}

	b.clock.Advance(time.Minute)
	if n, err := b.svc.DriveRefunds(context.Background()); err != nil || n != 1 {
		t.Fatalf("patrol = %d %v", n, err)
	}

	rec := b.do(post(refundsPath(p.ID), "{ \"amount\" : 250 }", "Idempotency-Key", "refund-1")) // canonical body
	r := wantRefund(t, rec, http.StatusAccepted)
	if r.ID != first.ID || r.Status != "Succeeded" || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay = %+v %v", r, rec.Header())
	}
	if r := wantRefund(t, b.do(get("/api/v1/refunds/"+first.ID)), http.StatusOK); r.Status != "Succeeded" {
		t.Fatalf("GET after the patrol = %+v", r)
	}

	// Another body, or the same body for another payment, with the key: 422.
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":251}`, "Idempotency-Key", "refund-1")), http.StatusUnprocessableEntity, "Idempotency-Key")
	other := b.completedPayment(t, "o-other", 1000)
	wantProblem(t, b.do(post(refundsPath(other.ID), `{"amount":250}`, "Idempotency-Key", "refund-1")), http.StatusUnprocessableEntity, "Idempotency-Key")
	// A key used for a create is not a refund's key either.
	wantPayment(t, b.do(post(createPath("o-keyed"), `{"amount":1,"currency":"EUR"}`, "Idempotency-Key", "shared")), http.StatusCreated)
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":1}`, "Idempotency-Key", "shared")), http.StatusUnprocessableEntity, "Idempotency-Key")
	// Still its own replay.
	rec = b.do(c)
	if r := wantRefund(t, rec, http.StatusAccepted); r.ID != first.ID || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay after 422s = %+v", r)
	}

	if n := b.refunds(t); n != 1 {
		t.Fatalf("refunds = %d", n)
	}
	if n := b.gw.KeyCalls(fakegw.OpRefund, first.ID); n != 2 {
		t.Fatalf("gateway refund calls with the refund's key = %d, want 2 (lost answer + patrol)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 1 {
		t.Fatalf("ledger entries = %d", n)
	}
}

// No key: three quick retries are one intent → one refund and one gateway call; the same amount
// after 5 minutes of silence is a new intent (a second partial refund), and another amount is
// another intent at once.
func TestAPIRefundWithoutKeyRetriesAreOneRefund(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-retries", 1000)
	c := post(refundsPath(p.ID), `{"amount":300}`)
	first := wantRefund(t, b.do(c), http.StatusCreated)
	for i := range 3 {
		b.clock.Advance(5 * time.Second)
		rec := b.do(c)
		if r := wantRefund(t, rec, http.StatusCreated); r.ID != first.ID || r.Status != "Succeeded" || rec.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry %d = %+v %v", i+1, r, rec.Header())
		}
	}
	if n := b.refunds(t); n != 1 {
		t.Fatalf("refunds after retries = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refund calls after retries = %d", n)
	}

	if r := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":200}`)), http.StatusCreated); r.ID == first.ID {
		t.Fatal("another amount is another intent")
	}
	b.clock.Advance(10 * time.Minute)
	if r := wantRefund(t, b.do(c), http.StatusCreated); r.ID == first.ID {
		t.Fatal("the same amount after 5 quiet minutes is a new intent")
	}
	if n := b.refunds(t); n != 3 {
		t.Fatalf("refunds = %d, want 3", n)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 3 {
		t.Fatalf("gateway refund calls = %d, want 3", n)
	}
}

// Failures before any effect do not burn the key: a 409 (not Completed yet), a 404 and a 422
// leave it free, and the same key then serves the request that works.
func TestAPIRefundFailuresBeforeEffectDoNotBurnTheKey(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("o-later"), `{"amount":1000,"currency":"EUR"}`)), http.StatusCreated)
	c := post(refundsPath(p.ID), `{"amount":100}`, "Idempotency-Key", "k")
	wantProblem(t, b.do(c), http.StatusConflict, "")
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":0}`, "Idempotency-Key", "k")), http.StatusUnprocessableEntity, "amount")
	wantProblem(t, b.do(post(refundsPath("00000000-0000-0000-0000-000000000000"), `{"amount":100}`, "Idempotency-Key", "k")), http.StatusNotFound, "")
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys WHERE kind = 'key'`); n != 0 {
		t.Fatalf("keys after failures = %d", n)
	}

	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)
	wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", "")), http.StatusOK)
	rec := b.do(c)
	if r := wantRefund(t, rec, http.StatusCreated); r.Status != "Succeeded" || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("after capture = %+v %v", r, rec.Header())
	}
}

// While the key's first request is at the gateway, the same request gets 409 + Retry-After
// (with a key and without one). A request that died there (its lock went stale) is taken over
// by the same request, which finds the refund the dead one claimed and answers it as it is: one
// refund, asked at the gateway once, one ledger entry.
// Negative control (run by hand): with the takeover driving the refund it found, the gateway is
// asked twice, the second time beside the first request's drive, unleased.
func TestAPIRefundInFlightAndTakeover(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-inflight", 1000)
	gate := b.gw.Hold(fakegw.OpRefund)
	defer gate.Open()

	c := post(refundsPath(p.ID), `{"amount":700}`, "Idempotency-Key", "slow")
	dead := b.goDo(b.e, c)
	refundID := mustWait(t, gate.Arrived(), "the first request at the gateway")
	rec := b.do(c)
	wantProblem(t, rec, http.StatusConflict, "")
	if rec.Header().Get("Retry-After") == "" {
		t.Fatal("409 without Retry-After")
	}

	// Without a key, an identical request while the first one waits for the gateway is the same
	// refund (contract: "Keyless requests"): 202 with it, Pending, and no gateway call of its own
	// (before: 409 "a request with this key is still in progress", for a key it never sent).
	keyless := post(refundsPath(p.ID), `{"amount":50}`)
	firstKeyless := b.goDo(b.e, keyless)
	keylessID := mustWait(t, gate.Arrived(), "the keyless request at the gateway")
	for range 3 {
		rec = b.do(keyless)
		if r := wantRefund(t, rec, http.StatusAccepted); r.ID != keylessID || r.Status != "Pending" || rec.Header().Get("Location") != "/api/v1/refunds/"+keylessID {
			t.Fatalf("keyless repeat in flight = %+v", r)
		}
	}
	if n := b.gw.KeyCalls(fakegw.OpRefund, keylessID); n != 1 {
		t.Fatalf("gateway calls for the keyless refund = %d, want 1", n)
	}

	// The takeover finds the refund the first request claimed and answers it as it is (202,
	// Pending), asking the gateway nothing: the request that made it (or the patrol, under its
	// lease) settles it. A second drive of its own would run beside theirs, unleased.
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	rec = b.do(c)
	if r := wantRefund(t, rec, http.StatusAccepted); r.ID != refundID || r.Status != "Pending" {
		t.Fatalf("takeover = %+v, want refund %s Pending", r, refundID)
	}
	if n := b.gw.KeyCalls(fakegw.OpRefund, refundID); n != 1 {
		t.Fatalf("gateway calls for the taken-over refund = %d, want the first request's 1", n)
	}
	gate.Open()
	if r := wantRefund(t, mustWait(t, dead, "first"), http.StatusCreated); r.ID != refundID || r.Status != "Succeeded" {
		t.Fatalf("first = %+v, want refund %s", r, refundID)
	}
	if r := wantRefund(t, mustWait(t, firstKeyless, "keyless"), http.StatusCreated); r.ID != keylessID {
		t.Fatalf("keyless = %+v", r)
	}
	// The key was completed by the takeover with the refund the first request's claim recorded
	// (no answer's code: the first request never gave one): its replay answers the refund as it
	// is now, 201 Succeeded.
	rec = b.do(c)
	if r := wantRefund(t, rec, http.StatusCreated); r.ID != refundID || r.Status != "Succeeded" || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay after the takeover = %+v", r)
	}
	if n := b.refunds(t); n != 2 {
		t.Fatalf("refunds = %d, want 2", n)
	}
	if n := b.gw.KeyCalls(fakegw.OpRefund, refundID); n != 1 {
		t.Fatalf("gateway calls for the taken-over refund = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 2 {
		t.Fatalf("ledger entries = %d", n)
	}
}

// A key reused after its 30 days is a new request: on the same payment, with another amount, it
// creates a new refund (the old one belongs to the key's first use), not a 409.
func TestAPIRefundKeyReusedAfterExpiryIsNewRequest(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-reuse", 1000)
	first := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":100}`, "Idempotency-Key", "monthly")), http.StatusCreated)
	b.clock.Advance(31 * 24 * time.Hour)
	second := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":200}`, "Idempotency-Key", "monthly")), http.StatusCreated)
	if second.ID == first.ID || second.Amount != 200 {
		t.Fatalf("reused key after expiry = %+v, first %+v", second, first)
	}
	if n := b.refunds(t); n != 2 {
		t.Fatalf("refunds = %d, want 2", n)
	}
}

// No key, across a clock boundary: a refund at 12:04:59 and its retry at 12:05:01 are one refund
// (the main before this change cut intents at 5-minute marks of the clock and refunded twice),
// and so is every retry within 5 minutes of the one before; one refund, one gateway call. The
// other side of the rule: 5 minutes after the last identical request, the same amount is a new
// refund.
func TestAPIKeylessRefundAcrossAClockBoundaryIsOneRefund(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-boundary", 1000)
	c := post(refundsPath(p.ID), `{"amount":300}`)
	b.clock.Set(t0.Add(4*time.Minute + 59*time.Second)) // 12:04:59
	first := wantRefund(t, b.do(c), http.StatusCreated)
	for _, step := range []time.Duration{2 * time.Second, 4*time.Minute + 59*time.Second, 4*time.Minute + 59*time.Second} {
		b.clock.Advance(step) // 12:05:01, 12:10:00, 12:14:59
		if r := wantRefund(t, b.do(c), http.StatusCreated); r.ID != first.ID {
			t.Fatalf("retry at %s = a new refund %s", b.clock.Now().Format("15:04:05"), r.ID)
		}
	}
	if n, calls := b.refunds(t), b.gw.Calls(fakegw.OpRefund); n != 1 || calls != 1 {
		t.Fatalf("refunds = %d, gateway calls = %d; want 1 and 1", n, calls)
	}
	// Five quiet minutes, and the intent's grace more: a request that read its time inside the
	// window may reach the key that late (TestAKeylessRefundRetryInsideTheWindowOvertakenByALaterOneIsOneRefund).
	b.clock.Advance(5*time.Minute + payments.IntentGraceFor(0))
	if r := wantRefund(t, b.do(c), http.StatusCreated); r.ID == first.ID {
		t.Fatal("five minutes and the grace after the last identical request: the same refund again")
	}
	if n := b.refunds(t); n != 2 {
		t.Fatalf("refunds = %d, want 2", n)
	}
}

// A shop lists a payment's refunds as they are now, oldest first: how it reconciles its refunds,
// or finds one whose answer it lost. An unknown payment is 404; a payment without refunds an
// empty list (not null).
func TestAPIListRefunds(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-list", 1000)
	type list struct {
		PaymentID string   `json:"payment_id"`
		Refunds   []refund `json:"refunds"`
		HasMore   bool     `json:"has_more"`
	}
	rec := b.do(get(refundsPath(p.ID)))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"refunds":[]`) {
		t.Fatalf("no refunds yet: %d %s", rec.Code, rec.Body)
	}
	first := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":100}`, "Idempotency-Key", "r-1")), http.StatusCreated)
	b.clock.Advance(time.Second)
	b.gw.SetRefundOutcome("pending") // the gateway has not settled the second one yet
	second := wantRefund(t, b.do(post(refundsPath(p.ID), `{"amount":250}`, "Idempotency-Key", "r-2")), http.StatusAccepted)
	rec = b.do(get(refundsPath(p.ID)))
	got := decode[list](t, rec)
	if rec.Code != http.StatusOK || got.PaymentID != p.ID || got.HasMore || len(got.Refunds) != 2 ||
		got.Refunds[0] != first || got.Refunds[1].ID != second.ID || got.Refunds[1].Status != "Pending" {
		t.Fatalf("refunds of %s: %d %+v; want %s then %s (Pending)", p.ID, rec.Code, got, first.ID, second.ID)
	}
	for _, id := range []string{"00000000-0000-4000-8000-000000000000", first.ID, "not-a-uuid"} {
		wantProblem(t, b.do(get(refundsPath(id))), http.StatusNotFound, "")
	}
}

// Identical keyless refunds are the same refund (contract: "Keyless requests"), also while the
// first is inside its claim: the duplicate gave 409 busy (an outside review: up to 5 of 12 in a
// burst). The interleaving: the first holds the intent and is parked inside its claim (the
// payment's locks held); the duplicate must wait for the claim (seen in pg_locks), then find the
// first's refund by the first's RequestKey. One refund, one gateway call, no 409.
func TestAPIKeylessIdenticalRefundsNeverConflict(t *testing.T) {
	t.Parallel()
	p := newParker()
	var parked atomic.Bool // only the first claim parks; the duplicate's goes on
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) {
		c.Hooks.AfterRefundLock = func(ctx context.Context, id string) {
			if parked.CompareAndSwap(false, true) {
				p.hook(ctx, id)
			}
		}
	}})
	t.Cleanup(func() { p.release <- struct{}{} })
	pay := b.completedPayment(t, "o-refund-burst", 1000)
	c := post(refundsPath(pay.ID), `{"amount":300}`)
	first := b.goDo(b.e, c)
	mustWait(t, p.arrived, "the first refund inside its claim")
	second := b.goDo(b.e, c)
	waitBlockedOrAnswered(t, b, second)
	p.release <- struct{}{}
	r1 := wantRefund(t, mustWait(t, first, "first"), http.StatusCreated)
	rec := mustWait(t, second, "duplicate")
	if rec.Code != http.StatusCreated && rec.Code != http.StatusAccepted {
		t.Fatalf("duplicate = %d %s, want the same refund (201/202)", rec.Code, rec.Body)
	}
	if r2 := wantRefund(t, rec, rec.Code); r2.ID != r1.ID {
		t.Fatalf("two refunds: %s and %s", r1.ID, r2.ID)
	}
	if n := b.refunds(t); n != 1 {
		t.Fatalf("refunds = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refund calls = %d", n)
	}
}

// The keyless intent window slides only forward. A request of a burst that read its time
// earlier (it waited for a pool connection or the key's lock; replica B's lagging clock stands
// in for that wait here) and slides after a later one moved expires_at back, so a repeat 4m58s
// after the burst's latest request was a new intent: a second refund of the same amount (an
// outside review).
func TestAPIKeylessRefundWindowNeverSlidesBack(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-slide", 1000)
	lag := payments.NewManualClock(t0)
	_, eB := b.server(t, b.pool, "replica-b", benchOpt{core: func(c *payments.Config) { c.Clock = lag }})
	refund := post(refundsPath(p.ID), `{"amount":100}`)

	b.clock.Set(t0.Add(time.Minute))
	first := wantRefund(t, b.do(refund), http.StatusCreated)
	b.clock.Set(t0.Add(time.Minute + 10*time.Second)) // the burst's latest request, on A
	if r := wantRefund(t, b.do(refund), http.StatusCreated); r.ID != first.ID {
		t.Fatalf("repeat = %s", r.ID)
	}
	lag.Set(t0.Add(time.Minute + 7*time.Second)) // B read its time 3 s earlier, slides after A
	if r := wantRefund(t, b.on(eB, refund), http.StatusCreated); r.ID != first.ID {
		t.Fatalf("B's repeat = %s", r.ID)
	}
	b.clock.Set(t0.Add(time.Minute + 10*time.Second + 5*time.Minute - 2*time.Second)) // 4m58s after the latest
	if r := wantRefund(t, b.do(refund), http.StatusCreated); r.ID != first.ID {
		t.Fatalf("a repeat 4m58s after the burst's latest request = %s, want the same refund %s", r.ID, first.ID)
	}
	if n := b.refunds(t); n != 1 {
		t.Fatalf("refunds = %d, want 1", n)
	}
}

// The reaper keeps an intent for payments.IdempotencyReapGrace after it expired. A keyless
// refund retried 4m59s after an identical one read its time inside the window and then waited
// (for a pool connection; replica B's lagging clock stands in for the wait); another replica's
// housekeeping reaped the row at the window's edge meanwhile, the retry's INSERT found no row
// and started a new use of the intent: a second refund of the same amount (an outside review,
// retention).
func TestKeylessRefundRetriedAtTheWindowsEdgeOutlivesTheReaper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-reap-edge", 1000)
	lag := payments.NewManualClock(t0)
	_, eB := b.server(t, b.pool, "replica-b", benchOpt{core: func(c *payments.Config) { c.Clock = lag }})
	refund := post(refundsPath(p.ID), `{"amount":100}`)

	b.clock.Set(t0.Add(10 * time.Minute))
	first := wantRefund(t, b.do(refund), http.StatusCreated) // the intent expires at t0+15m
	b.clock.Set(t0.Add(15 * time.Minute))
	if _, err := b.svc.ReapIdempotencyKeys(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	lag.Set(t0.Add(15*time.Minute - time.Second)) // B's retry read its time 4m59s after the first
	if r := wantRefund(t, b.on(eB, refund), http.StatusCreated); r.ID != first.ID {
		t.Errorf("a keyless refund 4m59s after an identical one, reaped meanwhile = a new refund %s (first %s)", r.ID, first.ID)
	}
	if n, calls := b.refunds(t), b.gw.Calls(fakegw.OpRefund); n != 1 || calls != 1 {
		t.Fatalf("refunds = %d, gateway calls = %d; want 1 and 1", n, calls)
	}
}

// A keyless refund's intent is the shop's, not one API client's: the same refund asked for by
// two clients within the window (two services of one shop, or one service half-way through a
// key rotation retrying with its new key) is one refund and one gateway call. The intent was
// kept per client, and the second client refunded the customer again (outside review). Each
// client's own Idempotency-Key stays its own (TestAPIKeysOfOneClientInvisibleToAnother); the
// reserved owner of the intents is never a client anyone lists or signs in as.
func TestAPIKeylessRefundIsOneRefundWhicheverClientAsks(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	staff := payments.Staff{Email: "test@example.com", Role: "admin"}
	_, rotated, err := b.access.CreateAPIClient(context.Background(), staff, "shop, new key")
	if err != nil {
		t.Fatal(err)
	}
	p := b.completedPayment(t, "o-two-clients", 1000)
	c := post(refundsPath(p.ID), `{"amount":300}`)
	first := wantRefund(t, b.do(c), http.StatusCreated)
	b.clock.Advance(time.Minute)
	c.headers["Authorization"] = "Bearer " + rotated
	if again := wantRefund(t, b.do(c), http.StatusCreated); again.ID != first.ID {
		t.Fatalf("the other client's identical keyless refund = a new refund %s (first %s)", again.ID, first.ID)
	}
	if n, calls := b.refunds(t), b.gw.Calls(fakegw.OpRefund); n != 1 || calls != 1 {
		t.Fatalf("refunds = %d, gateway calls = %d; want 1 and 1", n, calls)
	}

	clients, err := b.access.ListAPIClients(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range clients {
		if cl.ID == payments.RefundIntentOwner {
			t.Fatal("the reserved owner of refund intents is listed as an API client")
		}
	}
	if len(clients) != 2 {
		t.Fatalf("API clients listed = %d, want the two made here", len(clients))
	}
	if _, err := b.access.RevokeAPIClient(context.Background(), staff, payments.RefundIntentOwner); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("revoke the reserved owner = %v, want not found", err)
	}
	wantProblem(t, b.do(post(refundsPath(p.ID), `{"amount":1}`, "Authorization", "Bearer pl_000000000000_"+strings.Repeat("0", 64))), http.StatusUnauthorized, "")
}

// A keyed refund retried under the client's rotated key (pitlane apikey rotate) is the same
// request: a replay of the one refund, one gateway call. Rotating used to mean a new client,
// whose Idempotency-Keys are its own, so the retry was a second refund (a known gap of session
// 29). Negative control: RotateAPIKey making a new client (CreateAPIClient) gives two refunds.
func TestAPIKeyedRefundRetriedUnderARotatedKeyIsOneRefund(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := b.completedPayment(t, "o-rotated-key", 1000)
	c := post(refundsPath(p.ID), `{"amount":300}`, "Idempotency-Key", "refund-o-rotated-key-1")
	first := wantRefund(t, b.do(c), http.StatusCreated)
	_, rotated, err := b.access.RotateAPIKey(context.Background(), payments.Staff{Email: "test@example.com", Role: "admin"}, b.client.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	c.headers["Authorization"] = "Bearer " + rotated
	rec := b.do(c)
	if again := wantRefund(t, rec, http.StatusCreated); again.ID != first.ID || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry under the rotated key = refund %s replayed %q (first %s)", again.ID, rec.Header().Get("Idempotent-Replayed"), first.ID)
	}
	if n, calls := b.refunds(t), b.gw.Calls(fakegw.OpRefund); n != 1 || calls != 1 {
		t.Fatalf("refunds = %d, gateway calls = %d; want 1 and 1", n, calls)
	}
}
