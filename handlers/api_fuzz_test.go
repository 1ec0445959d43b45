package handlers_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"pitlane/payments"
)

// FuzzAPIDecode drives request decoding and validation through the real router (auth, body
// limit, content type, JSON, fields, Idempotency-Key, path parameters) with arbitrary input:
// whatever comes in, the answer is never a 5xx (a panic would be one: the recoverer turns it
// into a 500), and every refusal is problem+json. `make test` runs the seed corpus; explore with
// go test ./handlers -run '^$' -fuzz FuzzAPIDecode.
func FuzzAPIDecode(f *testing.F) {
	seeds := []struct {
		ct, body, key, order string
	}{
		{"application/json", `{"amount":100,"currency":"EUR"}`, "", "o-1"},
		{"application/json", `{"amount":100,"currency":"EUR","customer_contact":"a@b.c"}`, "key-1", "o-2"},
		{"application/json", `{"amount":100,"currency":"EUR"}`, "key-1", "o-2"},
		{"application/json; charset=utf-8", `{"challenge_id":"00000000-0000-0000-0000-000000000000","code":"123456"}`, "", "o"},
		{"application/json", `{"amount":1e400,"currency":"EUR"}`, "", "o"},
		{"application/json", `{"amount":-0,"currency":"EUR"}`, "", "o"},
		{"application/json", `{"amount":9223372036854775808,"currency":"EUR"}`, "", "o"},
		{"application/json", `{"amount":100,"currency":"EUR","amount":1}`, "", "o"},
		{"application/json", `{"amount":[],"currency":{}}`, "", "o"},
		{"application/json", `{"\u0000":1}`, "", "o"},
		{"application/json", `{"amount":1,"currency":"EUR","customer_contact":"a\u0000b"}`, "", "nul"},
		{"application/json", "{\"amount\":1,\"currency\":\"\xed\xa0\x80\"}", "", "o"},
		{"application/json", `{`, "", "o"},
		{"application/json", ``, "", "o"},
		{"application/json", `"just a string"`, "", "o"},
		{"application/json", `{"amount":100,"currency":"EUR"} trailing`, "", "o"},
		{"text/plain", `{"amount":100,"currency":"EUR"}`, "", "o"},
		{"", `{"amount":100,"currency":"EUR"}`, "", "o"},
		{";;;", `{}`, "", "o"},
		{"application/json", `{"amount":100,"currency":"EUR"}`, "k\r\ney", "o"},
		{"application/json", `{"amount":100,"currency":"EUR"}`, "k", "../../payments"},
		{"application/json", `{"amount":100,"currency":"EUR"}`, "k", "a/b?c#d"},
		{"application/json", `{"amount":100,"currency":"EUR"}`, "k", ""},
		{"application/json", `{"amount":100,"currency":"EUR"}`, "k", "ü"},
		// Refunds: {"amount"} alone, against a Completed payment and against path ids.
		{"application/json", `{"amount":1}`, "", "o"},
		{"application/json", `{"amount":1}`, "refund-key", "00000000-0000-0000-0000-000000000000"},
		{"application/json", `{"amount":100000}`, "", "o"},
		{"application/json", `{"amount":1,"currency":"EUR"}`, "", "o"},
		{"application/json", `{"amount":"1"}`, "", "{00000000-0000-0000-0000-000000000000}"},
		{"application/json", `{"amount":1}`, "", "urn:uuid:00000000-0000-0000-0000-000000000000"},
		{"application/json", `{"amount":1}`, "", "00000000-0000-0000-0000-00000000000Z"},
	}
	for _, s := range seeds {
		f.Add(s.ct, []byte(s.body), s.key, s.order)
	}
	b := newAPIBench(f)
	rec := b.do(post(createPath("fuzz-existing"), `{"amount":100,"currency":"EUR"}`))
	if rec.Code != http.StatusCreated {
		f.Fatalf("setup: %d %s", rec.Code, rec.Body)
	}
	existing := decodeF[payment](f, rec).ID
	// A Completed payment, so refunds get past the decoder into the idempotency protocol and the
	// core (and, while the amount lasts, the gateway).
	rec = b.do(post(createPath("fuzz-paid"), `{"amount":100000,"currency":"EUR"}`))
	if rec.Code != http.StatusCreated {
		f.Fatalf("setup: %d %s", rec.Code, rec.Body)
	}
	paid := decodeF[payment](f, rec)
	b.gw.SetStatus(*paid.GatewayPaymentID, payments.GatewaySucceeded)
	if rec := b.do(post("/api/v1/payments/"+paid.ID+"/check", "")); rec.Code != http.StatusOK || decodeF[payment](f, rec).Status != "Completed" {
		f.Fatalf("setup: check %d %s", rec.Code, rec.Body)
	}

	f.Fuzz(func(t *testing.T, contentType string, body []byte, key, orderID string) {
		paths := []string{
			createPath(url.PathEscape(orderID)),
			"/api/v1/payments/" + existing + "/cancel/confirm",
			"/api/v1/payments/" + existing + "/check",
			"/api/v1/orders/" + url.PathEscape(orderID),
			"/api/v1/payments/" + url.PathEscape(orderID),
			"/api/v1/payments/" + paid.ID + "/refunds",
			"/api/v1/payments/" + url.PathEscape(orderID) + "/refunds",
			"/api/v1/refunds/" + url.PathEscape(orderID),
			"/api/v1/orders/" + url.PathEscape(orderID) + "/checkout-links",
			"/api/v1/orders/fuzz-paid/checkout-links", // a paid order: 409 past the decoder
		}
		for i, path := range paths {
			method := http.MethodPost
			if i == 3 || i == 4 || i == 7 {
				method = http.MethodGet
			}
			r, err := http.NewRequest(method, "http://pitlane.test"+path, bytes.NewReader(body))
			if err != nil {
				continue // not a request a client could send
			}
			r.Header.Set("Authorization", "Bearer "+b.key)
			if contentType != "" {
				r.Header["Content-Type"] = []string{contentType}
			}
			if key != "" {
				r.Header["Idempotency-Key"] = []string{key}
			}
			rec := httptest.NewRecorder()
			b.e.ServeHTTP(rec, r)
			if rec.Code >= 500 {
				t.Fatalf("%s %s (ct %q, key %q, body %q) = %d %s", method, path, contentType, key, body, rec.Code, rec.Body)
			}
			if rec.Code >= 400 && rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%s %s = %d with content type %q", method, path, rec.Code, rec.Header().Get("Content-Type"))
			}
		}
	})
}
