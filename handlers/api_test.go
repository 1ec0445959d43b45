package handlers_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

func TestAPIAuthentication(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	path := "/api/v1/payments/00000000-0000-0000-0000-000000000000"

	rec := b.do(get(path, "Authorization", ""))
	wantProblem(t, rec, http.StatusUnauthorized, "")
	if h := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
		t.Fatalf("WWW-Authenticate = %q", h)
	}
	for _, auth := range []string{"Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Bearer pl_000000000000_" + strings.Repeat("0", 64), "Bearer " + b.key + "0"} {
		rec := b.do(get(path, "Authorization", auth))
		wantProblem(t, rec, http.StatusUnauthorized, "")
		if rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%q: no WWW-Authenticate", auth)
		}
	}
	// Unauthenticated requests learn nothing about routes or bodies.
	wantProblem(t, b.do(post(createPath("o"), `{"amount":1,"currency":"EUR"}`, "Authorization", "")), http.StatusUnauthorized, "")

	// A known key works (404: the payment does not exist), then revoked → 403.
	wantProblem(t, b.do(get(path)), http.StatusNotFound, "")
	if _, err := b.access.RevokeAPIClient(context.Background(), payments.Staff{Email: "test@example.com", Role: "admin"}, b.client.KeyPrefix); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, b.do(get(path)), http.StatusForbidden, "")

	// The OpenAPI document needs no key.
	rec = b.do(get("/api/openapi.json", "Authorization", ""))
	if rec.Code != http.StatusOK || !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("openapi = %d", rec.Code)
	}
}

func TestAPICreateStatuses(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	body := `{"amount":1999,"currency":"EUR","customer_contact":"ann@example.com"}`

	// 201: registered at the gateway; every field of the contract's payment object.
	rec := b.do(post(createPath("order-1"), body))
	p := wantPayment(t, rec, http.StatusCreated)
	if rec.Header().Get("Location") != "/api/v1/payments/"+p.ID || p.Links.Self != "/api/v1/payments/"+p.ID {
		t.Fatalf("location %q self %q", rec.Header().Get("Location"), p.Links.Self)
	}
	if p.OrderID != "order-1" || p.Status != "Registered" || p.Amount != 1999 || p.Currency != "EUR" ||
		p.GatewayPaymentID == nil || p.ConfirmationURL == nil || p.CreatedAt == "" || p.UpdatedAt == "" {
		t.Fatalf("payment %+v", p)
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
	if got := strings.Join(names, ","); got != "amount,confirmation_url,created_at,currency,gateway_payment_id,id,links,order_id,status,updated_at" {
		t.Fatalf("payment fields = %s", got)
	}
	if _, err := time.Parse(time.RFC3339Nano, p.CreatedAt); err != nil {
		t.Fatalf("created_at %q: %v", p.CreatedAt, err)
	}
	if rec.Header().Get("Idempotent-Replayed") != "" {
		t.Fatal("a first request is not a replay")
	}

	// 200: the same amount and currency while active → that session, as it is now. (A new
	// window of the intent clock, so this goes through the core's answer, not an intent replay.)
	b.clock.Advance(10 * time.Minute)
	rec = b.do(post(createPath("order-1"), `{"currency":"EUR","amount":1999}`))
	if again := wantPayment(t, rec, http.StatusOK); again.ID != p.ID || rec.Header().Get("Location") != "/api/v1/payments/"+p.ID {
		t.Fatalf("same parameters = %+v", again)
	}
	// 409: other parameters while active.
	wantProblem(t, b.do(post(createPath("order-1"), `{"amount":2000,"currency":"EUR"}`)), http.StatusConflict, "")

	// 202: the registration's answer was lost → Unknown: poll Location.
	b.gw.Fail(fakegw.OpRegister, fakegw.Transient, 1)
	rec = b.do(post(createPath("order-2"), body))
	if u := wantPayment(t, rec, http.StatusAccepted); u.Status != "Unknown" || rec.Header().Get("Location") != "/api/v1/payments/"+u.ID {
		t.Fatalf("unknown = %+v", u)
	}

	// 409: the order is paid.
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)
	if c := wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", "")), http.StatusOK); c.Status != "Completed" {
		t.Fatalf("check = %+v", c)
	}
	b.clock.Advance(10 * time.Minute)
	wantProblem(t, b.do(post(createPath("order-1"), body)), http.StatusConflict, "")
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Fatalf("registrations = %d, want 2", n)
	}
}

func TestAPICreateRejectsBadRequests(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	ok := `{"amount":100,"currency":"EUR"}`
	cases := []struct {
		name   string
		c      call
		status int
		field  string
	}{
		{"not JSON content type", post(createPath("o"), ok, "Content-Type", "text/plain"), 415, ""},
		{"form content type", post(createPath("o"), "amount=100", "Content-Type", "application/x-www-form-urlencoded"), 415, ""},
		{"latin-1", post(createPath("o"), ok, "Content-Type", "application/json; charset=iso-8859-1"), 415, ""},
		{"utf-16", post(createPath("o"), ok, "Content-Type", "application/json; charset=UTF-16"), 415, ""},
		{"empty body", post(createPath("o"), "", "Content-Type", "application/json"), 400, ""},
		{"no body at all", post(createPath("o"), ""), 400, ""},
		{"no content type, not JSON", post(createPath("o"), "amount=100", "Content-Type", ""), 400, ""},
		{"truncated", post(createPath("o"), `{"amount":100,`), 400, ""},
		{"array", post(createPath("o"), `[1]`), 400, ""},
		{"null", post(createPath("o"), `null`), 400, ""},
		{"trailing data", post(createPath("o"), ok+`{}`), 400, ""},
		{"not UTF-8", post(createPath("o"), "{\"amount\":100,\"currency\":\"EU\xff\"}"), 400, ""},
		{"unknown field", post(createPath("o"), `{"amount":100,"currency":"EUR","amout":1}`), 422, "amout"},
		{"duplicate field", post(createPath("o"), `{"amount":100,"amount":200,"currency":"EUR"}`), 422, "amount"},
		{"amount missing", post(createPath("o"), `{"currency":"EUR"}`), 422, "amount"},
		{"amount null", post(createPath("o"), `{"amount":null,"currency":"EUR"}`), 422, "amount"},
		{"amount string", post(createPath("o"), `{"amount":"100","currency":"EUR"}`), 422, "amount"},
		{"amount fraction", post(createPath("o"), `{"amount":100.5,"currency":"EUR"}`), 422, "amount"},
		{"amount exponent", post(createPath("o"), `{"amount":1e3,"currency":"EUR"}`), 422, "amount"},
		{"amount zero", post(createPath("o"), `{"amount":0,"currency":"EUR"}`), 422, "amount"},
		{"amount negative", post(createPath("o"), `{"amount":-1,"currency":"EUR"}`), 422, "amount"},
		{"amount 10^12", post(createPath("o"), `{"amount":1000000000000,"currency":"EUR"}`), 422, "amount"},
		{"amount overflow", post(createPath("o"), `{"amount":99999999999999999999999,"currency":"EUR"}`), 422, "amount"},
		{"currency missing", post(createPath("o"), `{"amount":100}`), 422, "currency"},
		{"currency lower", post(createPath("o"), `{"amount":100,"currency":"eur"}`), 422, "currency"},
		{"currency number", post(createPath("o"), `{"amount":100,"currency":978}`), 422, "currency"},
		{"contact with NUL", post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":"a\u0000b"}`), 422, "customer_contact"},
		{"contact object", post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":{}}`), 422, "customer_contact"},
		{"contact with a right-to-left override", post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":"\u202egnp.exe@evil.com"}`), 422, "customer_contact"},
		{"contact with a line separator", post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":"ana\u2028@example.com"}`), 422, "customer_contact"},
		{"contact with a private-use character", post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":"ana\ue000@example.com"}`), 422, "customer_contact"},
		{"contact with a zero-width space", post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":"ana\u200b@example.com"}`), 422, "customer_contact"},
		{"contact too long", post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":"`+strings.Repeat("a", 321)+`"}`), 422, "customer_contact"},
		{"order id characters", post(createPath("bad%20id"), ok), 422, "order_id"},
		{"order id too long", post(createPath(strings.Repeat("o", 65)), ok), 422, "order_id"},
		{"key too long", post(createPath("o"), ok, "Idempotency-Key", strings.Repeat("k", 256)), 422, "Idempotency-Key"},
		{"key not ASCII", post(createPath("o"), ok, "Idempotency-Key", strings.Repeat("é", 10)), 422, "Idempotency-Key"},
		{"key with a control byte", post(createPath("o"), ok, "Idempotency-Key", "a\tb"), 422, "Idempotency-Key"},
		{"body over 64 KiB", post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":"`+strings.Repeat("a", 64<<10)+`"}`), 413, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := wantProblem(t, b.do(tc.c), tc.status, tc.field)
			// A refused key names the whole rule, whichever part it broke (a key of 10 é
			// is 10 characters: "must be 1-255 characters" alone misled).
			if tc.field == "Idempotency-Key" && !strings.Contains(p.Detail, "1-255 printable ASCII characters") {
				t.Fatalf("detail %q does not state the rule", p.Detail)
			}
		})
	}
	// A body over the limit without a Content-Length (chunked) is cut off while reading.
	r := b.request(post(createPath("o"), `{"amount":100,"currency":"EUR","customer_contact":"`+strings.Repeat("a", 70<<10)+`"}`))
	r.ContentLength = -1
	rec := httptest.NewRecorder()
	b.e.ServeHTTP(rec, r)
	wantProblem(t, rec, http.StatusRequestEntityTooLarge, "")

	if n := b.sessions(t); n != 0 {
		t.Fatalf("bad requests created %d sessions", n)
	}
	if n := b.count(t, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Fatalf("bad requests left %d idempotency keys", n)
	}
	// application/*+json and an explicit UTF-8 charset are JSON.
	wantPayment(t, b.do(post(createPath("o"), ok, "Content-Type", "application/merge-patch+json; charset=UTF-8")), http.StatusCreated)
	// So are UTF-8 as HTTP libraries spell it and ASCII, which is UTF-8 (415 was every create
	// of a shop whose library writes charset=utf8, a review; without jsonCharsets, 415).
	for i, cs := range []string{"utf8", "UTF8", "us-ascii", "ASCII"} {
		wantPayment(t, b.do(post(createPath("o-charset-"+strconv.Itoa(i)), ok, "Content-Type", "application/json; charset="+cs)), http.StatusCreated)
	}
	// A JSON body sent without a Content-Type (a client that forgot the header) is read as the
	// JSON it is; declared as something else it is refused above (415).
	if p := wantPayment(t, b.do(post(createPath("o-no-content-type"), ok, "Content-Type", "")), http.StatusCreated); p.OrderID != "o-no-content-type" {
		t.Fatalf("create without a Content-Type = %+v", p)
	}
	// A contact in any script, with a no-break space pasted from a web page, is a contact.
	wantPayment(t, b.do(post(createPath("o-contact"), `{"amount":100,"currency":"EUR","customer_contact":"Zoë Müller +49\u00a030 1234 / 山田"}`)), http.StatusCreated)
}

func TestAPIGetPaymentAndOrder(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("ord.1:a-b_c"), `{"amount":500,"currency":"USD"}`)), http.StatusCreated)

	got := wantPayment(t, b.do(get("/api/v1/payments/"+p.ID)), http.StatusOK)
	if got.ID != p.ID || got.Status != "Registered" || got.OrderID != "ord.1:a-b_c" {
		t.Fatalf("get = %+v", got)
	}
	wantProblem(t, b.do(get("/api/v1/payments/00000000-0000-0000-0000-000000000000")), http.StatusNotFound, "")
	wantProblem(t, b.do(get("/api/v1/payments/not-a-uuid")), http.StatusNotFound, "")

	rec := b.do(get("/api/v1/orders/ord.1:a-b_c"))
	if rec.Code != http.StatusOK {
		t.Fatalf("order = %d %s", rec.Code, rec.Body)
	}
	o := decode[struct {
		OrderID  string    `json:"order_id"`
		Status   string    `json:"status"`
		Payments []payment `json:"payments"`
	}](t, rec)
	if o.OrderID != "ord.1:a-b_c" || o.Status != "AwaitingPayment" || len(o.Payments) != 1 || o.Payments[0].ID != p.ID {
		t.Fatalf("order = %+v", o)
	}
	wantProblem(t, b.do(get("/api/v1/orders/never-seen")), http.StatusNotFound, "")
}

func TestAPICheck(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("o"), `{"amount":500,"currency":"USD"}`)), http.StatusCreated)

	// 503 + Retry-After: the gateway did not answer; nothing changed.
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	rec := b.do(post("/api/v1/payments/"+p.ID+"/check", ""))
	wantProblem(t, rec, http.StatusServiceUnavailable, "")
	if rec.Header().Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewayAuthorized)
	if c := wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", "")), http.StatusOK); c.Status != "Authorized" {
		t.Fatalf("check = %+v", c)
	}
	// An empty JSON object is an empty body; anything else is refused.
	if c := wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", `{}`)), http.StatusOK); c.Status != "Authorized" {
		t.Fatalf("check {} = %+v", c)
	}
	wantProblem(t, b.do(post("/api/v1/payments/"+p.ID+"/check", `{"force":true}`)), http.StatusUnprocessableEntity, "force")
	wantProblem(t, b.do(post("/api/v1/payments/"+p.ID+"/check", `x`, "Content-Type", "text/plain")), http.StatusUnsupportedMediaType, "")
	wantProblem(t, b.do(post("/api/v1/payments/00000000-0000-0000-0000-000000000000/check", "")), http.StatusNotFound, "")
	if n := b.gw.Calls(fakegw.OpStatus); n != 3 {
		t.Fatalf("status calls = %d, want 3", n)
	}
}

func TestAPICancelFlow(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	b.clock.Set(t0.Add(123456789 * time.Nanosecond)) // a clock finer than the database's microseconds
	p := wantPayment(t, b.do(post(createPath("o"), `{"amount":500,"currency":"USD","customer_contact":"+15550100"}`)), http.StatusCreated)
	cancel := "/api/v1/payments/" + p.ID + "/cancel"

	rec := b.do(post(cancel, ""))
	if rec.Code != http.StatusAccepted {
		t.Fatalf("cancel = %d %s", rec.Code, rec.Body)
	}
	ch := decode[struct {
		ChallengeID string `json:"challenge_id"`
		ExpiresAt   string `json:"expires_at"`
	}](t, rec)
	if exp, err := time.Parse(time.RFC3339Nano, ch.ExpiresAt); err != nil || !exp.After(t0) || ch.ChallengeID == "" ||
		!exp.Equal(exp.Truncate(time.Microsecond)) {
		t.Fatalf("challenge %+v %v (want microseconds at most, as stored)", ch, err)
	}
	code := b.lastCode(t, p.ID)
	wrong := "000000"
	if code == wrong {
		wrong = "111111"
	}
	confirm := func(challenge, code string) call {
		return post(cancel+"/confirm", `{"challenge_id":"`+challenge+`","code":"`+code+`"}`)
	}
	wantProblem(t, b.do(confirm(ch.ChallengeID, wrong)), http.StatusUnprocessableEntity, "")
	wantProblem(t, b.do(post(cancel+"/confirm", `{"challenge_id":"`+ch.ChallengeID+`","code":123456}`)), http.StatusUnprocessableEntity, "code")
	wantProblem(t, b.do(post(cancel+"/confirm", `{"code":"123456"}`)), http.StatusUnprocessableEntity, "challenge_id")
	wantProblem(t, b.do(post(cancel+"/confirm", `{"challenge_id":"`+ch.ChallengeID+`"`)), http.StatusBadRequest, "")

	done := wantPayment(t, b.do(confirm(ch.ChallengeID, code)), http.StatusAccepted)
	if done.ID != p.ID || (done.Status != "Canceling" && done.Status != "Canceled") {
		t.Fatalf("confirm = %+v", done)
	}
	again := wantPayment(t, b.do(confirm(ch.ChallengeID, code)), http.StatusOK)
	if again.ID != p.ID || again.Status != "Canceled" {
		t.Fatalf("confirm again = %+v", again)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("reverses = %d, want 1", n)
	}
	// Canceled is not cancelable.
	wantProblem(t, b.do(post(cancel, "")), http.StatusConflict, "")
	wantProblem(t, b.do(post("/api/v1/payments/00000000-0000-0000-0000-000000000000/cancel", "")), http.StatusNotFound, "")
}

func TestAPICancelCodeRules(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	ctx := context.Background()
	newChallenge := func(t *testing.T, id string) (string, string) {
		t.Helper()
		rec := b.do(post("/api/v1/payments/"+id+"/cancel", ""))
		if rec.Code != http.StatusAccepted {
			t.Fatalf("cancel = %d %s", rec.Code, rec.Body)
		}
		return decode[struct {
			ChallengeID string `json:"challenge_id"`
		}](t, rec).ChallengeID, b.lastCode(t, id)
	}
	p := wantPayment(t, b.do(post(createPath("o"), `{"amount":500,"currency":"USD"}`)), http.StatusCreated)
	confirm := func(challenge, code string) call {
		return post("/api/v1/payments/"+p.ID+"/cancel/confirm", `{"challenge_id":"`+challenge+`","code":"`+code+`"}`)
	}

	// 410: expired.
	ch, code := newChallenge(t, p.ID)
	b.clock.Advance(11 * time.Minute)
	wantProblem(t, b.do(confirm(ch, code)), http.StatusGone, "")

	// 429: attempts used up (5 wrong ones are 422, then the right one is too late).
	ch, code = newChallenge(t, p.ID)
	wrong := "000000"
	if code == wrong {
		wrong = "111111"
	}
	for i := range 5 {
		if rec := b.do(confirm(ch, wrong)); rec.Code != http.StatusUnprocessableEntity {
			t.Fatalf("wrong code %d = %d %s", i+1, rec.Code, rec.Body)
		}
	}
	wantProblem(t, b.do(confirm(ch, code)), http.StatusTooManyRequests, "")

	// 409: the payment completed between the code request and the confirmation.
	ch, code = newChallenge(t, p.ID)
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorSystem}, p.ID); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, b.do(confirm(ch, code)), http.StatusConflict, "")
	// A wrong code on it is 409 too, and spends no guess: nothing is left to cancel.
	wantProblem(t, b.do(confirm(ch, wrong)), http.StatusConflict, "")
	if n := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE challenge_id = $1`, ch); n != 0 {
		t.Fatalf("wrong guesses on the completed payment's code = %d, want 0", n)
	}
	// 404: a challenge that is not this payment's.
	wantProblem(t, b.do(confirm("00000000-0000-0000-0000-000000000000", code)), http.StatusNotFound, "")
	if n := b.gw.Calls(fakegw.OpReverse); n != 0 {
		t.Fatalf("reverses = %d, want 0", n)
	}

	// The customer pays after the code was sent and before the confirmation reaches the
	// gateway: the reverse is refused and nothing was canceled, so the confirmation is 409 (not
	// a 202 carrying a Completed payment), and so is the same code again.
	q := wantPayment(t, b.do(post(createPath("o-race"), `{"amount":500,"currency":"USD"}`)), http.StatusCreated)
	ch, code = newChallenge(t, q.ID)
	b.gw.SetStatus(*q.GatewayPaymentID, payments.GatewaySucceeded)
	for range 2 {
		wantProblem(t, b.do(post("/api/v1/payments/"+q.ID+"/cancel/confirm", `{"challenge_id":"`+strings.ToUpper(ch)+`","code":"`+code+`"}`)),
			http.StatusConflict, "")
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("reverses = %d, want 1", n)
	}
	if got := wantPayment(t, b.do(get("/api/v1/payments/"+q.ID)), http.StatusOK); got.Status != "Completed" {
		t.Fatalf("after the lost race: %s, want Completed", got.Status)
	}
}

// The contract's one-time code limits over HTTP: an earlier challenge answers 410 once a new code
// was sent; the fourth code request within an hour answers 429 with Retry-After (seconds until
// the first request leaves the hour); the tenth wrong guess locks the payment's codes: 429 with
// Retry-After, for the right code too.
func TestAPICodeLimits(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("o-limits"), `{"amount":500,"currency":"USD"}`)), http.StatusCreated)
	request := func() *httptest.ResponseRecorder { return b.do(post("/api/v1/payments/"+p.ID+"/cancel", "")) }
	challenge := func(t *testing.T) (string, string) {
		t.Helper()
		rec := request()
		if rec.Code != http.StatusAccepted {
			t.Fatalf("cancel = %d %s", rec.Code, rec.Body)
		}
		return decode[struct {
			ChallengeID string `json:"challenge_id"`
		}](t, rec).ChallengeID, b.lastCode(t, p.ID)
	}
	confirm := func(challenge, code string) call {
		return post("/api/v1/payments/"+p.ID+"/cancel/confirm", `{"challenge_id":"`+challenge+`","code":"`+code+`"}`)
	}
	other := func(code string) string {
		if code == "000000" {
			return "111111"
		}
		return "000000"
	}

	first, firstCode := challenge(t)
	b.clock.Advance(5 * time.Minute)
	second, secondCode := challenge(t)
	wantProblem(t, b.do(confirm(first, firstCode)), http.StatusGone, "")
	for range 4 {
		if rec := b.do(confirm(second, other(secondCode))); rec.Code != http.StatusUnprocessableEntity {
			t.Fatalf("wrong code = %d %s", rec.Code, rec.Body)
		}
	}
	b.clock.Advance(5 * time.Minute)
	third, thirdCode := challenge(t)
	rec := request()
	wantProblem(t, rec, http.StatusTooManyRequests, "")
	if got := rec.Header().Get("Retry-After"); got != "3000" {
		t.Fatalf("Retry-After = %q, want 3000 (50 minutes)", got)
	}
	for range 4 {
		if rec := b.do(confirm(third, other(thirdCode))); rec.Code != http.StatusUnprocessableEntity {
			t.Fatalf("wrong code = %d %s", rec.Code, rec.Body)
		}
	}
	// 8 wrong so far; the third code locks at its fifth attempt, so the last two budget units
	// are spent after a fourth code an hour after the first.
	b.clock.Advance(time.Hour)
	fourth, fourthCode := challenge(t)
	for range 2 {
		if rec := b.do(confirm(fourth, other(fourthCode))); rec.Code != http.StatusUnprocessableEntity {
			t.Fatalf("wrong code = %d %s", rec.Code, rec.Body)
		}
	}
	rec = b.do(confirm(fourth, fourthCode))
	wantProblem(t, rec, http.StatusTooManyRequests, "")
	if got := rec.Header().Get("Retry-After"); got == "" || got == "1" {
		t.Fatalf("Retry-After = %q, want the hours until the first wrong guess is a day old", got)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 0 {
		t.Fatalf("reverses = %d, want 0", n)
	}
}

// A payment that is over (Failed, Canceled) has no payment page for a customer: the API leaves
// its confirmation_url out even when the gateway's is stored, so a shop never sends a customer
// to pay a payment pitlane has closed. Its gateway id stays.
func TestAPIPaymentOverHasNoConfirmationURL(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	p := wantPayment(t, b.do(post(createPath("order-over"), `{"amount":500,"currency":"EUR"}`)), http.StatusCreated)
	if p.ConfirmationURL == nil || p.GatewayPaymentID == nil {
		t.Fatalf("registered payment %+v", p)
	}
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewayDeclined)
	if c := wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", "")), http.StatusOK); c.Status != "Failed" || c.ConfirmationURL != nil {
		t.Fatalf("after the decline: %+v", c)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE id = $1 AND confirmation_url <> ''`, p.ID); n != 1 {
		t.Fatal("the stored URL is gone: this test no longer shows the API leaving it out")
	}
	if g := wantPayment(t, b.do(get("/api/v1/payments/"+p.ID)), http.StatusOK); g.ConfirmationURL != nil || g.GatewayPaymentID == nil {
		t.Fatalf("GET the Failed payment: %+v", g)
	}
}
