package handlers_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
)

// Bytes PostgreSQL refuses to store in text (a NUL, a sequence that is not UTF-8) come only from
// the request. Wherever they reach a statement they are the client's mistake — a clear 400 or
// 422 with nothing written — never a 500 (from an outside audit: the sign-in form, the console's
// search and audit filters, the create forms' contact and a signed webhook's event id all
// answered 500, and a gateway retries a 5xx delivery forever).

func TestUnstorableBytesInTheConsoleAreClientErrors(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "adm@example.com", access.RoleAdmin)

	// Anonymous sign-in: a NUL in the email is one more unknown email (same answer, throttled
	// like any other), not a 500 from the throttle's table.
	anon := b.agent(t)
	anon.get("/login")
	for _, email := range []string{"adm\x00@example.com", "adm\xff\xfe@example.com"} {
		rec := anon.post("/login", url.Values{"email": {email}, "password": {"wrong-password-123"}})
		if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "wrong email or password") {
			t.Fatalf("sign-in with %q = %d %s", email, rec.Code, rec.Body)
		}
	}

	a := b.agent(t)
	a.login("adm@example.com")
	for _, path := range []string{"/payments?q=%00", "/payments?q=%ff%fe", "/admin/audit?actor=%00", "/admin/audit?target=%ff%fe",
		"/admin/audit.csv?actor=%00", "/admin/audit.csv?target=%ff%fe"} { // the CSV before its status is sent (it aborted)
		if rec := a.get(path); rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "cannot be stored") {
			t.Fatalf("GET %s = %d, want 400 naming the bytes:\n%s", path, rec.Code, rec.Body)
		}
	}
	// The console's create form refuses the contact by name; nothing is written.
	for _, contact := range []string{"a\x00b", "\xff\xfe", "line\nbreak"} {
		rec := a.post("/payments", url.Values{"order_id": {"o-nul"}, "amount": {"10.00"}, "currency": {"EUR"}, "customer_contact": {contact}})
		if rec.Code >= 500 || !strings.Contains(rec.Body.String(), "customer_contact") {
			t.Fatalf("console create with contact %q = %d:\n%s", contact, rec.Code, rec.Body)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("orders = %d, want 0", n)
	}
}

func TestUnstorableBytesInTheAPIAndWebhooksAreClientErrors(t *testing.T) {
	t.Parallel()
	api := newAPIBench(t)
	for _, contact := range []string{`a\u0000b`, `tab\there`, `esc\u001b[31m`} {
		wantProblem(t, api.do(post(createPath("o-nul"), `{"amount":100,"currency":"EUR","customer_contact":"`+contact+`"}`)),
			http.StatusUnprocessableEntity, "customer_contact")
	}
	if n := api.sessions(t); n != 0 {
		t.Fatalf("sessions = %d, want 0", n)
	}

	wh := newWHBench(t, whRefgw)
	s := wh.registered(t, "o-wh-nul")
	before := wh.written(t)
	body := []byte(strings.Replace(string(whEvent("evt_nul", s, s.GatewayPaymentID, "succeeded")), `"evt_nul"`, `"evt_\u0000nul"`, 1))
	rec := wh.deliverSigned(body)
	if rec.Code != http.StatusBadRequest || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("signed event with a NUL in its id = %d %s %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	if after := wh.written(t); after != before {
		t.Fatalf("written %+v, want %+v", after, before)
	}
}

// The API's refusals read as sentences: "not an array", "1 attempt left".
func TestAPIRefusalsReadAsSentences(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	for body, want := range map[string]string{
		`{"amount":[],"currency":"EUR"}`:                        "amount must be an integer in minor units, not an array",
		`{"amount":{},"currency":"EUR"}`:                        "not an object",
		`{"amount":"5","currency":"EUR"}`:                       "not a string",
		`{"amount":5,"currency":"EUR","customer_contact":true}`: "customer_contact must be a string, not a boolean",
	} {
		if p := wantProblem(t, b.do(post(createPath("o-words"), body)), http.StatusUnprocessableEntity, ""); !strings.Contains(p.Detail, want) {
			t.Errorf("%s: %q, want %q in it", body, p.Detail, want)
		}
	}
	p := wantPayment(t, b.do(post(createPath("o-words"), `{"amount":500,"currency":"USD"}`)), http.StatusCreated)
	rec := b.do(post("/api/v1/payments/"+p.ID+"/cancel", ""))
	ch := decode[struct {
		ChallengeID string `json:"challenge_id"`
	}](t, rec).ChallengeID
	code := b.lastCode(t, p.ID)
	wrong := "000000"
	if code == wrong {
		wrong = "111111"
	}
	var last problem
	for range 4 {
		last = wantProblem(t, b.do(post("/api/v1/payments/"+p.ID+"/cancel/confirm", `{"challenge_id":"`+ch+`","code":"`+wrong+`"}`)),
			http.StatusUnprocessableEntity, "")
	}
	if last.Detail != "wrong code; 1 attempt left" {
		t.Fatalf("the fourth wrong code: %q", last.Detail)
	}
}
