package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// payForm reads the Pay form of a checkout page.
func payForm(t *testing.T, a *agent, path string) (action string, form url.Values) {
	t.Helper()
	doc := page(t, a.get(path), http.StatusOK)
	f := doc.Find(testid("checkout-form"))
	if f.Length() != 1 {
		t.Fatalf("no Pay form on %s: state %q", path, doc.Find(testid("checkout-state")).AttrOr("data-state", ""))
	}
	form = url.Values{}
	f.Find("input").Each(func(_ int, in *goquery.Selection) {
		form.Set(in.AttrOr("name", ""), in.AttrOr("value", ""))
	})
	return f.AttrOr("action", ""), form
}

func TestCheckoutPayOnceAndReturn(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t) // a customer: no staff session

	doc := page(t, a.get("/checkout/o-shop-1?amount=1999&currency=EUR"), http.StatusOK)
	wantText(t, doc, "checkout-pay", "Pay 19.99 EUR")
	action, form := payForm(t, a, "/checkout/o-shop-1?amount=1999&currency=EUR&contact=cust@example.com")
	if form.Get("intent") == "" || form.Get("csrf_token") == "" || form.Get("contact") != "cust@example.com" {
		t.Fatalf("form fields %v", form)
	}
	// Every render embeds a fresh intent key: one key per Pay click.
	_, form2 := payForm(t, a, "/checkout/o-shop-1?amount=1999&currency=EUR")
	if form2.Get("intent") == form.Get("intent") {
		t.Fatal("two renders share an intent key")
	}

	// Without the CSRF token: refused, nothing created.
	noToken := url.Values{}
	for k, v := range form {
		noToken[k] = v
	}
	noToken.Set("csrf_token", "")
	if rec := a.post(action, noToken); rec.Code != http.StatusForbidden {
		t.Fatalf("Pay without CSRF token: %d", rec.Code)
	}

	// Pay: to the gateway's page. The same click again (a resubmit): the same page, nothing new.
	rec := a.post(action, form)
	confirm := rec.Header().Get("Location")
	if rec.Code != http.StatusSeeOther || confirm == "" || confirm[0] == '/' {
		t.Fatalf("Pay: %d %q", rec.Code, confirm)
	}
	rec = a.post(action, form)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != confirm {
		t.Fatalf("Pay again: %d %q, want %q", rec.Code, rec.Header().Get("Location"), confirm)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-shop-1'`); n != 1 || b.gw.Calls(fakegw.OpRegister) != 1 {
		t.Fatalf("%d sessions, %d registrations; want 1 and 1", n, b.gw.Calls(fakegw.OpRegister))
	}
	var contact string
	if err := b.pool.QueryRow(context.Background(), `SELECT customer_contact FROM payment_sessions WHERE order_id = 'o-shop-1'`).Scan(&contact); err != nil || contact != "cust@example.com" {
		t.Fatalf("contact %q %v", contact, err)
	}
	// The same key with another amount is another request: refused.
	tampered := url.Values{}
	for k, v := range form {
		tampered[k] = v
	}
	tampered.Set("amount", "1")
	doc = page(t, a.post(action, tampered), http.StatusUnprocessableEntity)
	wantText(t, doc, "checkout-notice", "another order or amount")

	// Back on the order's page before paying: the way to the gateway's page again.
	doc = page(t, a.get("/checkout/o-shop-1"), http.StatusOK)
	if href := doc.Find(testid("checkout-continue")).AttrOr("href", ""); href != confirm {
		t.Fatalf("continue link %q, want %q", href, confirm)
	}
	// The customer paid at the gateway and comes back: Check, Paid.
	var gpID string
	if err := b.pool.QueryRow(context.Background(), `SELECT gateway_payment_id FROM payment_sessions WHERE order_id = 'o-shop-1'`).Scan(&gpID); err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(gpID, payments.GatewaySucceeded)
	doc = page(t, a.get("/checkout/o-shop-1/return"), http.StatusOK)
	wantText(t, doc, "checkout-paid", "Paid")
	wantText(t, doc, "checkout-status", "Completed")
	// A paid order offers no Pay form, whatever the link says.
	doc = page(t, a.get("/checkout/o-shop-1?amount=1999&currency=EUR"), http.StatusOK)
	if doc.Find(testid("checkout-form")).Length() != 0 {
		t.Fatal("a paid order offers Pay")
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-shop-1'`); n != 1 {
		t.Fatalf("%d ledger entries", n)
	}
}

func TestCheckoutAfterFailureAndBadLinks(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	// A link without amount for an order never seen: nothing to pay.
	doc := page(t, a.get("/checkout/o-new"), http.StatusBadRequest)
	wantText(t, doc, "checkout-no-amount", "incomplete")
	if rec := a.get("/checkout/bad%20id"); rec.Code != http.StatusNotFound {
		t.Fatalf("bad order id: %d", rec.Code)
	}

	// The gateway refuses the registration: the session fails. The same click again shows that
	// session (no second registration); a new click (new key) may try again.
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	action, form := payForm(t, a, "/checkout/o-fail?amount=500&currency=EUR")
	rec := a.post(action, form)
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("Pay: %d %s", rec.Code, rec.Body)
	}
	doc = page(t, a.follow(rec), http.StatusOK)
	wantText(t, doc, "checkout-notice", "did not go through")
	rec = a.post(action, form)
	page(t, a.follow(rec), http.StatusOK)
	if b.gw.Calls(fakegw.OpRegister) != 1 {
		t.Fatalf("the same click registered %d times", b.gw.Calls(fakegw.OpRegister))
	}
	// The order's page now offers a fresh try with the last amount, even without the query.
	action, form2 := payForm(t, a, "/checkout/o-fail")
	if form2.Get("amount") != "500" || form2.Get("intent") == form.Get("intent") {
		t.Fatalf("retry form %v", form2)
	}
	rec = a.post(action, form2)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location")[0] == '/' {
		t.Fatalf("second click: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-fail'`); n != 2 || b.gw.Calls(fakegw.OpRegister) != 2 {
		t.Fatalf("%d sessions, %d registrations; want 2 and 2", n, b.gw.Calls(fakegw.OpRegister))
	}
}
