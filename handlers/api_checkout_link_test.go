package handlers_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

type checkoutLink struct {
	URL       string    `json:"url"`
	OrderID   string    `json:"order_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	ExpiresAt time.Time `json:"expires_at"`
}

func linksPath(order string) string { return "/api/v1/orders/" + order + "/checkout-links" }

// TestAPICheckoutLinks: a shop asks for a signed checkout link (201, absolute under
// PUBLIC_BASE_URL) that then works on the checkout page, and nothing else does: no key → 401,
// a bad field → 422 naming it, a paid order → 409. Nothing is written.
func TestAPICheckoutLinks(t *testing.T) {
	t.Parallel()
	const base = "https://pay.example.com"
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) { c.PublicBaseURL = base }})

	rec := b.do(post(linksPath("o-link"), `{"amount":2500,"currency":"EUR"}`))
	if rec.Code != http.StatusCreated || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		t.Fatalf("create link: %d %s", rec.Code, rec.Body)
	}
	// The url as a terminal shows it, pasted into a browser: & not \u0026 (an outside review).
	if !strings.Contains(rec.Body.String(), "&currency=EUR") {
		t.Fatalf("the link's url is escaped for HTML in a JSON answer: %s", rec.Body)
	}
	l := decode[checkoutLink](t, rec)
	if l.OrderID != "o-link" || l.Amount != 2500 || l.Currency != "EUR" || !strings.HasPrefix(l.URL, base+"/checkout/o-link?") {
		t.Fatalf("link %+v", l)
	}
	u, err := url.Parse(l.URL)
	if err != nil || u.Query().Get("amount") != "2500" || u.Query().Get("currency") != "EUR" || len(u.Query().Get("sig")) != 64 {
		t.Fatalf("url %q: %v", l.URL, err)
	}
	if !l.ExpiresAt.Equal(b.clock.Now().Add(7*24*time.Hour)) || u.Query().Get("exp") != strconv.FormatInt(l.ExpiresAt.Unix(), 10) {
		t.Fatalf("link %+v: want expires_at 7 days on, signed in exp", l)
	}
	// A lifetime of the shop's choosing: expires_in seconds.
	if short := decode[checkoutLink](t, b.do(post(linksPath("o-link"), `{"amount":2500,"currency":"EUR","expires_in":3600}`))); !short.ExpiresAt.Equal(b.clock.Now().Add(time.Hour)) {
		t.Fatalf("one-hour link %+v", short)
	}
	// The same input at the same moment, the same link (a signature, not a row).
	if again := decode[checkoutLink](t, b.do(post(linksPath("o-link"), `{"currency":"EUR", "amount":2500}`))); again.URL != l.URL {
		t.Fatalf("second link %q, want %q", again.URL, l.URL)
	}

	// The customer opens it: the Pay form for 25.00 EUR, signed.
	a := newAgent(t, b.e)
	action, form := payForm(t, a, u.RequestURI())
	if form.Get("amount") != "2500" || form.Get("currency") != "EUR" || form.Get("sig") != u.Query().Get("sig") || action != "/checkout/o-link" {
		t.Fatalf("form %s %v", action, form)
	}
	// The same link with the amount changed is not.
	q := u.Query()
	q.Set("amount", "1")
	noPayForm(t, a, u.Path+"?"+q.Encode(), http.StatusBadRequest)

	// Bearer auth like every /api/v1 call.
	wantProblem(t, b.do(post(linksPath("o-link"), `{"amount":2500,"currency":"EUR"}`, "Authorization", "")), http.StatusUnauthorized, "")
	wantProblem(t, b.do(post(linksPath("o-link"), `{"amount":2500,"currency":"EUR"}`, "Authorization", "Bearer pl_000000000000_"+strings.Repeat("0", 64))), http.StatusUnauthorized, "")

	// Create's strict decoding and validation, the field named.
	for _, tc := range []struct{ order, body, field string }{
		{"o-link", `{"amount":0,"currency":"EUR"}`, "amount"},
		{"o-link", `{"amount":"2500","currency":"EUR"}`, "amount"},
		{"o-link", `{"amount":25.00,"currency":"EUR"}`, "amount"},
		{"o-link", `{"currency":"EUR"}`, "amount"},
		{"o-link", `{"amount":2500,"currency":"eur"}`, "currency"},
		{"o-link", `{"amount":2500}`, "currency"},
		{"o-link", `{"amount":2500,"currency":"EUR","customer_contact":"a@b.c"}`, "customer_contact"},
		{"o-link", `{"amount":2500,"currency":"EUR","sig":"x"}`, "sig"},
		{"o-link", `{"amount":2500,"currency":"EUR","amount":1}`, "amount"},
		{"o-link", `{"amount":2500,"currency":"EUR","expires_in":59}`, "expires_in"},
		{"o-link", `{"amount":2500,"currency":"EUR","expires_in":2592001}`, "expires_in"},
		{"o-link", `{"amount":2500,"currency":"EUR","expires_in":"3600"}`, "expires_in"},
		{"o-link", `{"amount":2500,"currency":"EUR","expires_in":36.5}`, "expires_in"},
		{"o%20link", `{"amount":2500,"currency":"EUR"}`, "order_id"},
	} {
		wantProblem(t, b.do(post(linksPath(tc.order), tc.body)), http.StatusUnprocessableEntity, tc.field)
	}
	wantProblem(t, b.do(post(linksPath("o-link"), `{"amount":2500,"currency":"EUR"`)), http.StatusBadRequest, "")
	wantProblem(t, b.do(post(linksPath("o-link"), `{"amount":2500,"currency":"EUR"}`, "Content-Type", "text/plain")), http.StatusUnsupportedMediaType, "")
	if n := b.sessions(t); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("links wrote %d sessions, %d registrations", n, b.gw.Calls(fakegw.OpRegister))
	}
	if n := b.count(t, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("links wrote %d orders", n)
	}

	// A paid order gets no link: 409.
	p := wantPayment(t, b.do(post(createPath("o-paid"), `{"amount":2500,"currency":"EUR"}`)), http.StatusCreated)
	if rec := b.do(post(linksPath("o-paid"), `{"amount":2500,"currency":"EUR"}`)); rec.Code != http.StatusCreated {
		t.Fatalf("link for an order awaiting payment: %d %s", rec.Code, rec.Body)
	}
	// While that payment is active, a link for another amount or currency could not be paid
	// (the page would show the active payment; a Pay click would be Create's 409): 409 now, to
	// the shop, naming the active payment (an outside audit: 201, and a confusing page).
	for _, body := range []string{`{"amount":1,"currency":"EUR"}`, `{"amount":2500,"currency":"USD"}`} {
		if p := wantProblem(t, b.do(post(linksPath("o-paid"), body)), http.StatusConflict, ""); !strings.Contains(p.Detail, "active payment of 2500 EUR") {
			t.Fatalf("link %s beside an active payment: %q", body, p.Detail)
		}
	}
	b.gw.SetStatus(*p.GatewayPaymentID, payments.GatewaySucceeded)
	if st := wantPayment(t, b.do(post("/api/v1/payments/"+p.ID+"/check", "")), http.StatusOK); st.Status != "Completed" {
		t.Fatalf("check: %s", st.Status)
	}
	wantProblem(t, b.do(post(linksPath("o-paid"), `{"amount":2500,"currency":"EUR"}`)), http.StatusConflict, "")
}
