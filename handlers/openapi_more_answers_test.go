package handlers_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Answers the document did not describe (an outside review, openapi): each is now in
// handlers/openapi.json, and the validator checks it.

// POST /api/v1/payments/{id}/check of a payment registered at another gateway (GATEWAY changed
// with payments under way, payments/other_gateway_test.go) answers 409, which checkPayment did
// not list.
func TestOpenAPICheckOfAnotherGatewaysPaymentIs409(t *testing.T) {
	t.Parallel()
	v := newDocValidator(t)
	b := newAPIBench(t)
	rec := b.do(post(createPath("o-doc-gw"), `{"amount":1500,"currency":"EUR"}`))
	p := wantPayment(t, rec, http.StatusCreated)
	if _, err := b.pool.Exec(context.Background(), `UPDATE payment_sessions SET gateway = 'old' WHERE id = $1`, p.ID); err != nil {
		t.Fatal(err)
	}
	rec = b.do(post("/api/v1/payments/"+p.ID+"/check", ""))
	t.Logf("check of another gateway's payment: %d %s", rec.Code, rec.Body)
	v.check(http.MethodPost, "/api/v1/payments/{id}/check", rec)
}

// A one-time code whose own 5 attempts are used up answers 429 (the contract's "attempts used
// up → 429") without Retry-After (waiting does not revive it: request a new code), which
// confirmCancel's 429 said it always carried.
func TestOpenAPIConfirmAttemptsUsedUpHasNoRetryAfter(t *testing.T) {
	t.Parallel()
	v := newDocValidator(t)
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("o-doc-att"), `{"amount":900,"currency":"EUR"}`)), http.StatusCreated)
	ch := b.do(post("/api/v1/payments/"+p.ID+"/cancel", ""))
	v.check(http.MethodPost, "/api/v1/payments/{id}/cancel", ch)
	var c struct {
		ChallengeID string `json:"challenge_id"`
	}
	_ = json.Unmarshal(ch.Body.Bytes(), &c)
	right := b.lastCode(t, p.ID)
	wrong := "000000"
	if right == wrong {
		wrong = "111111"
	}
	confirm := `{"challenge_id":"` + c.ChallengeID + `","code":"` + wrong + `"}`
	for i := 0; i < 5; i++ {
		rec := b.do(post("/api/v1/payments/"+p.ID+"/cancel/confirm", confirm))
		if rec.Code != http.StatusUnprocessableEntity {
			t.Fatalf("wrong code %d: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	rec := b.do(post("/api/v1/payments/"+p.ID+"/cancel/confirm", confirm))
	t.Logf("6th attempt: %d Retry-After=%q %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("6th attempt: %d, want 429", rec.Code)
	}
	v.check(http.MethodPost, "/api/v1/payments/{id}/cancel/confirm", rec)
}

// The events feed answers next_cursor "" (an empty feed read from its start, or after=end on an
// empty feed) and the document says to pass next_cursor back as after "also when data is
// empty", but the after parameter's pattern refused "": a client generated from the document
// could not send what the document told it to.
func TestOpenAPIEmptyNextCursorIsAValidAfter(t *testing.T) {
	t.Parallel()
	v := newDocValidator(t)
	b := newAPIBench(t)
	rec := b.do(get("/api/v1/events"))
	v.check(http.MethodGet, "/api/v1/events", rec)
	var page struct {
		NextCursor string `json:"next_cursor"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
		t.Fatal(err)
	}
	sch, err := v.c.Compile("openapi.json#" + pointer("paths", "/api/v1/events", "get", "parameters", "0", "schema"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(page.NextCursor); err != nil {
		t.Errorf("next_cursor %q, passed back as after as the document says, is not a valid after: %v", page.NextCursor, err)
	}
	// The server itself takes it.
	if rec := b.do(get("/api/v1/events?after=" + page.NextCursor)); rec.Code != http.StatusOK {
		t.Errorf("after=%q: %d", page.NextCursor, rec.Code)
	}
}

// The rest of the routes' answers, good and bad, through the validator (those
// TestAPIAnswersMatchTheOpenAPIDocument does not drive; an outside review, openapi).
func TestOpenAPIMoreAnswers(t *testing.T) {
	t.Parallel()
	v := newDocValidator(t)
	b := newAPIBench(t)
	do := func(c call, tpl string) *httptest.ResponseRecorder {
		t.Helper()
		rec := b.do(c)
		t.Logf("%s %s -> %d", c.method, c.path[:min(len(c.path), 80)], rec.Code)
		v.check(c.method, tpl, rec)
		return rec
	}
	const refunds = "/api/v1/payments/{id}/refunds"
	paid := b.completedPayment(t, "o-doc-r", 1000)
	// keyed refund, replay, other body, pending refund
	r1 := do(post(refundsPath(paid.ID), `{"amount":100}`, "Idempotency-Key", "k1"), refunds)
	r2 := do(post(refundsPath(paid.ID), `{"amount":100}`, "Idempotency-Key", "k1"), refunds)
	if r2.Header().Get("Idempotent-Replayed") != "true" || r1.Header().Get("Location") == "" || r2.Header().Get("Location") == "" {
		t.Errorf("refund replay headers: %v / %v", r1.Header(), r2.Header())
	}
	do(post(refundsPath(paid.ID), `{"amount":101}`, "Idempotency-Key", "k1"), refunds) // 422
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1)
	pend := do(post(refundsPath(paid.ID), `{"amount":50}`), refunds) // 202 Pending
	t.Logf("pending refund: %d %s", pend.Code, pend.Body)
	do(post(refundsPath("not-a-uuid"), `{"amount":50}`), refunds)                                         // 404
	do(post(refundsPath("00000000-0000-0000-0000-000000000000"), `{"amount":50}`), refunds)               // 404
	do(post(refundsPath(paid.ID), `{"amount":50}`, "Idempotency-Key", strings.Repeat("x", 256)), refunds) // 422
	do(post(refundsPath(paid.ID), `{"amount":50}`, "Content-Type", "text/plain"), refunds)                // 415
	do(post(refundsPath(paid.ID), `{"amount":50,"amount":50}`), refunds)                                  // 422
	do(post(refundsPath(paid.ID), `[]`), refunds)                                                         // 400
	do(post(refundsPath(paid.ID), `{"amount":"50"}`+strings.Repeat(" ", 70000)), refunds)                 // 413
	do(get(refundsPath(paid.ID)), refunds)                                                                // 200
	do(get(refundsPath("00000000-0000-0000-0000-000000000000")), refunds)                                 // 404
	do(get(refundsPath("nope")), refunds)                                                                 // 404
	var rf struct{ ID string }
	_ = json.Unmarshal(r1.Body.Bytes(), &rf)
	do(get("/api/v1/refunds/"+rf.ID), "/api/v1/refunds/{id}")                               // 200
	do(get("/api/v1/refunds/nope"), "/api/v1/refunds/{id}")                                 // 404
	do(get("/api/v1/refunds/00000000-0000-0000-0000-000000000000"), "/api/v1/refunds/{id}") // 404
	do(get("/api/v1/payments/nope"), "/api/v1/payments/{id}")                               // 404
	do(get("/api/v1/orders/bad%20id"), "/api/v1/orders/{order_id}")                         // 404
	do(get("/api/v1/orders/o-never"), "/api/v1/orders/{order_id}")                          // 404
	do(post("/api/v1/payments/nope/check", ""), "/api/v1/payments/{id}/check")              // 404
	do(post("/api/v1/payments/nope/cancel", ""), "/api/v1/payments/{id}/cancel")            // 404
	do(post("/api/v1/payments/"+paid.ID+"/cancel", ""), "/api/v1/payments/{id}/cancel")     // 409
	do(post("/api/v1/payments/nope/cancel/confirm", `{"challenge_id":"00000000-0000-0000-0000-000000000000","code":"1"}`), "/api/v1/payments/{id}/cancel/confirm")
	do(get("/api/v1/payments/"+paid.ID+"/events"), "/api/v1/payments/{id}/events")
	do(get("/api/v1/payments/nope/events"), "/api/v1/payments/{id}/events")
	do(get("/api/v1/payments/"+paid.ID+"/events?limit=0"), "/api/v1/payments/{id}/events")
	do(get("/api/v1/events?after=end"), "/api/v1/events")
	do(get("/api/v1/events?after=99999999999-1"), "/api/v1/events") // 410
	do(get("/api/v1/events?limit=x"), "/api/v1/events")
	do(post("/api/v1/orders/o-x/checkout-links", `{"amount":1,"currency":"EUR","expires_in":5}`), "/api/v1/orders/{order_id}/checkout-links")
	do(post("/api/v1/orders/o-x/checkout-links", `{"amount":1,"currency":"eur"}`), "/api/v1/orders/{order_id}/checkout-links")
	do(post(createPath("o-doc-c"), `{"amount":1,"currency":"EUR","customer_contact":"\u0007"}`), "/api/v1/orders/{order_id}/payments")
	do(post(createPath("o-doc-c"), `{"amount":1,"currency":"EUR"}`, "Content-Type", "text/plain"), "/api/v1/orders/{order_id}/payments")

	// cancel flow: 202, confirm 202, the same code 200, an older challenge 410, 4th request 429
	live := wantPayment(t, b.do(post(createPath("o-doc-cx"), `{"amount":700,"currency":"EUR"}`)), http.StatusCreated)
	var first struct {
		ChallengeID string `json:"challenge_id"`
	}
	_ = json.Unmarshal(do(post("/api/v1/payments/"+live.ID+"/cancel", ""), "/api/v1/payments/{id}/cancel").Body.Bytes(), &first)
	var second struct {
		ChallengeID string `json:"challenge_id"`
	}
	_ = json.Unmarshal(do(post("/api/v1/payments/"+live.ID+"/cancel", `{}`), "/api/v1/payments/{id}/cancel").Body.Bytes(), &second)
	code := b.lastCode(t, live.ID)
	do(post("/api/v1/payments/"+live.ID+"/cancel/confirm", `{"challenge_id":"`+first.ChallengeID+`","code":"`+code+`"}`), "/api/v1/payments/{id}/cancel/confirm") // 410
	thirdRec := do(post("/api/v1/payments/"+live.ID+"/cancel", ""), "/api/v1/payments/{id}/cancel")                                                               // 202 (3rd)
	do(post("/api/v1/payments/"+live.ID+"/cancel", ""), "/api/v1/payments/{id}/cancel")                                                                           // 429
	code = b.lastCode(t, live.ID)
	var third struct {
		ChallengeID string `json:"challenge_id"`
	}
	_ = json.Unmarshal(thirdRec.Body.Bytes(), &third)
	do(post("/api/v1/payments/"+live.ID+"/cancel/confirm", `{"challenge_id":"`+third.ChallengeID+`","code":"`+code+`"}`), "/api/v1/payments/{id}/cancel/confirm") // 202
	do(post("/api/v1/payments/"+live.ID+"/cancel/confirm", `{"challenge_id":"`+third.ChallengeID+`","code":"`+code+`"}`), "/api/v1/payments/{id}/cancel/confirm") // 200
	do(post("/api/v1/payments/"+live.ID+"/cancel/confirm", `{"challenge_id":"not-a-uuid-but-thirty-six-characters!","code":"1"}`), "/api/v1/payments/{id}/cancel/confirm")

	// scopes and revocation
	ctx := context.Background()
	_, readKey, err := b.access.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "reader", access.ScopePaymentsRead)
	if err != nil {
		t.Fatal(err)
	}
	// 403 scope: the one 403 that must say so in WWW-Authenticate (the document's header is
	// "required": false for the revoked key's)
	if rec := do(post(refundsPath(paid.ID), `{"amount":1}`, "Authorization", "Bearer "+readKey), refunds); !strings.Contains(rec.Header().Get("WWW-Authenticate"), "insufficient_scope") {
		t.Errorf("a missing scope's 403: WWW-Authenticate %q, want Bearer error=\"insufficient_scope\"", rec.Header().Get("WWW-Authenticate"))
	}
	do(get("/api/v1/payments/"+paid.ID, "Authorization", "Bearer pl_000000000000_"+strings.Repeat("0", 64)), "/api/v1/payments/{id}") // 401
	do(get("/api/v1/payments/"+paid.ID, "Authorization", "Basic x"), "/api/v1/payments/{id}")                                         // 401
}

// A revoked key's 403 carries no WWW-Authenticate (only a missing scope's does), which the
// shared Forbidden response said it always carried.
func TestOpenAPIRevokedKey403HasNoWWWAuthenticate(t *testing.T) {
	t.Parallel()
	v := newDocValidator(t)
	b := newAPIBench(t)
	ctx := context.Background()
	p := wantPayment(t, b.do(post(createPath("o-doc-rev"), `{"amount":100,"currency":"EUR"}`)), http.StatusCreated)
	cl, revKey, err := b.access.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.access.RevokeAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, cl.ID); err != nil {
		t.Fatal(err)
	}
	rv := b.do(get("/api/v1/payments/"+p.ID, "Authorization", "Bearer "+revKey))
	t.Logf("revoked: %d WWW-Authenticate=%q %s", rv.Code, rv.Header().Get("WWW-Authenticate"), rv.Body)
	v.check(http.MethodGet, "/api/v1/payments/{id}", rv)
}
