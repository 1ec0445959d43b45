package handlers_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// link is the signed checkout link of an order (what the shop gets from the API), as a path.
func (b *consoleBench) link(t testing.TB, order string, amount int64, currency string) string {
	t.Helper()
	l, err := b.svc.CheckoutLink(context.Background(), order, amount, currency, 0)
	if err != nil {
		t.Fatalf("checkout link %s %d %s: %v", order, amount, currency, err)
	}
	return l.Path()
}

// orderPage is the order's checkout page as pitlane links it without a checkout link (the
// gateway's return URL, the page's own updates, an error page's way back): with the order's page
// token (payments.OrderPageToken). suffix: "" or "/return".
func (b *consoleBench) orderPage(order, suffix string) string {
	return payments.CheckoutPath(order) + suffix + "?" + payments.OrderPageParam + "=" + b.svc.OrderPageToken(order)
}

// noPayForm asserts that a checkout page answers status with the bad-link state and no Pay form.
func noPayForm(t *testing.T, a *agent, path string, status int) *goquery.Document {
	t.Helper()
	doc := page(t, a.get(path), status)
	if doc.Find(testid("checkout-form")).Length() != 0 {
		t.Fatalf("%s offers a Pay form", path)
	}
	return doc
}

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

	link := b.link(t, "o-shop-1", 1999, "EUR")
	doc := page(t, a.get(link), http.StatusOK)
	wantText(t, doc, "checkout-pay", "Pay 19.99 EUR")
	action, form := payForm(t, a, link+"&contact=cust@example.com")
	if form.Get("intent") == "" || form.Get("csrf_token") == "" || form.Get("contact") != "cust@example.com" ||
		form.Get("sig") == "" || form.Get("amount") != "1999" || form.Get("currency") != "EUR" {
		t.Fatalf("form fields %v", form)
	}
	// Every render embeds a fresh intent key: one key per Pay click.
	_, form2 := payForm(t, a, link)
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
	// The same click with another amount: its sig does not sign it, and it is not the order's
	// last payment's amount either. Refused, nothing new.
	tampered := url.Values{}
	for k, v := range form {
		tampered[k] = v
	}
	tampered.Set("amount", "1")
	doc = page(t, a.post(action, tampered), http.StatusUnprocessableEntity)
	wantText(t, doc, "checkout-notice", "was changed")
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-shop-1'`); n != 1 || b.gw.Calls(fakegw.OpRegister) != 1 {
		t.Fatalf("%d sessions, %d registrations after a changed form; want 1 and 1", n, b.gw.Calls(fakegw.OpRegister))
	}

	// Back on the order's page before paying: the way to the gateway's page again (once the
	// gateway may be asked about the payment: within 5 s of its registration the page waits for
	// the gateway's word, TestCheckoutReturnWithin5sWaitsForTheGatewaysWord).
	b.clock.Advance(payments.PageLookEvery)
	doc = page(t, a.get(b.orderPage("o-shop-1", "")), http.StatusOK)
	if href := doc.Find(testid("checkout-continue")).AttrOr("href", ""); href != confirm {
		t.Fatalf("continue link %q, want %q", href, confirm)
	}
	// The customer paid at the gateway and comes back: Check, Paid.
	var gpID string
	if err := b.pool.QueryRow(context.Background(), `SELECT gateway_payment_id FROM payment_sessions WHERE order_id = 'o-shop-1'`).Scan(&gpID); err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(gpID, payments.GatewaySucceeded)
	b.clock.Advance(payments.PageLookEvery) // the page above asked the gateway; pages ask at most every 5 s
	doc = page(t, a.get(b.orderPage("o-shop-1", "/return")), http.StatusOK)
	wantText(t, doc, "checkout-paid", "Paid")
	wantText(t, doc, "checkout-status", "Completed")
	// A paid order offers no Pay form, whatever the link says (even its own signed link), and
	// gets no new link.
	doc = page(t, a.get(link), http.StatusOK)
	if doc.Find(testid("checkout-form")).Length() != 0 {
		t.Fatal("a paid order offers Pay")
	}
	// The same link cut short by a mail client: the page reads nothing of the order, so it
	// claims nothing about money (it told this customer, who paid, "Nothing was charged …
	// start the payment again": an outside review).
	doc = page(t, a.get(link[:len(link)-1]), http.StatusBadRequest)
	if body := doc.Text(); strings.Contains(body, "Nothing was charged") || strings.Contains(body, "start the payment again") ||
		!strings.Contains(body, "do not need to pay again") {
		t.Fatalf("a damaged link of a paid order says: %q", strings.Join(strings.Fields(doc.Find("main").Text()), " "))
	}
	if _, err := b.svc.CheckoutLink(context.Background(), "o-shop-1", 1999, "EUR", 0); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("a link for a paid order: %v, want a conflict", err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-shop-1'`); n != 1 {
		t.Fatalf("%d ledger entries", n)
	}
}

func TestCheckoutAfterFailureAndBadLinks(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	// The order's page without a link for an order never seen: nothing to pay.
	doc := noPayForm(t, a, b.orderPage("o-new", ""), http.StatusBadRequest)
	wantText(t, doc, "checkout-bad-link", "incomplete or was changed")
	if rec := a.get("/checkout/bad%20id"); rec.Code != http.StatusNotFound {
		t.Fatalf("bad order id: %d", rec.Code)
	}

	// The gateway refuses the registration: the session fails. The same click again shows that
	// session (no second registration); a new click (new key) may try again.
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	action, form := payForm(t, a, b.link(t, "o-fail", 500, "EUR"))
	rec := a.post(action, form)
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("Pay: %d %s", rec.Code, rec.Body)
	}
	doc = page(t, a.follow(rec), http.StatusOK)
	wantText(t, doc, "checkout-declined", "did not go through")
	wantText(t, doc, "checkout-retry", "Try again: pay 5.00 EUR")
	rec = a.post(action, form)
	page(t, a.follow(rec), http.StatusOK)
	if b.gw.Calls(fakegw.OpRegister) != 1 {
		t.Fatalf("the same click registered %d times", b.gw.Calls(fakegw.OpRegister))
	}
	// The order's page now offers a fresh try with the last amount, without a link (it is the
	// gateway's way back too). That form carries no sig: the POST finds the amount and currency
	// are the last payment's.
	action, form2 := payForm(t, a, b.orderPage("o-fail", ""))
	if form2.Get("amount") != "500" || form2.Get("currency") != "EUR" || form2.Get("intent") == form.Get("intent") || form2.Has("sig") {
		t.Fatalf("retry form %v", form2)
	}
	// A changed link is not quietly replaced by the last amount: it says it was changed.
	noPayForm(t, a, "/checkout/o-fail?amount=1&currency=EUR", http.StatusBadRequest)
	// Nor does the retry form pay another amount.
	other := url.Values{}
	for k, v := range form2 {
		other[k] = v
	}
	other.Set("amount", "499")
	page(t, a.post(action, other), http.StatusUnprocessableEntity)
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-fail'`); n != 1 || b.gw.Calls(fakegw.OpRegister) != 1 {
		t.Fatalf("%d sessions, %d registrations after a changed retry form; want 1 and 1", n, b.gw.Calls(fakegw.OpRegister))
	}
	rec = a.post(action, form2)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location")[0] == '/' {
		t.Fatalf("second click: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-fail'`); n != 2 || b.gw.Calls(fakegw.OpRegister) != 2 {
		t.Fatalf("%d sessions, %d registrations; want 2 and 2", n, b.gw.Calls(fakegw.OpRegister))
	}
}

// TestCheckoutLinksAreSigned: the page offers Pay only for the amount and currency a valid
// checkout link signs; an unsigned link or one changed in any part (order, amount, currency,
// sig) is a 400 page saying so, with no form.
func TestCheckoutLinksAreSigned(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	link := b.link(t, "o-signed", 1999, "EUR")
	sig, e, gsig := mustQuery(t, link).Get("sig"), mustQuery(t, link).Get("exp"), mustQuery(t, link).Get("gsig")
	if len(sig) != 64 {
		t.Fatalf("sig %q in %s, want 64 hex digits", sig, link)
	}
	exp, err := strconv.ParseInt(e, 10, 64)
	if err != nil {
		t.Fatalf("exp %q in %s", e, link)
	}
	later := strconv.FormatInt(exp+86400, 10)

	for _, bad := range []string{
		"/checkout/o-signed?amount=1999&currency=EUR",                                     // unsigned
		"/checkout/o-signed?amount=1999&currency=EUR&sig=" + sig,                          // no expiry
		"/checkout/o-signed?amount=1&currency=EUR&exp=" + e + "&sig=" + sig,               // amount changed
		"/checkout/o-signed?amount=1999&currency=JPY&exp=" + e + "&sig=" + sig,            // currency changed
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + later + "&sig=" + sig,        // expiry moved on
		"/checkout/o-other?amount=1999&currency=EUR&exp=" + e + "&sig=" + sig,             // another order
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + e + "&sig=" + sig[:63] + "0", // sig changed
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + e + "&sig=" + sig[:62],       // sig cut
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + e + "&sig=" + strings.Repeat("zz", 32),
		"/checkout/o-signed?amount=01999.0&currency=EUR&exp=" + e + "&sig=" + sig,
		"/checkout/o-signed?sig=" + sig,
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + e + "&gen=1&gsig=" + gsig + "&sig=" + sig,  // generation moved on
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + e + "&gsig=" + gsig + "&sig=" + sig,        // gsig without gen
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + e + "&gen=0&sig=" + sig,                    // gen without gsig
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + e + "&gen=0&gsig=" + sig + "&sig=" + sig,   // gsig is sig
		"/checkout/o-signed?amount=1999&currency=EUR&exp=" + e + "&gen=0&gsig=" + gsig + "&sig=" + gsig, // sig is gsig
	} {
		doc := noPayForm(t, a, bad, http.StatusBadRequest)
		wantText(t, doc, "checkout-bad-link", "incomplete or was changed")
	}
	// A link signed under another secret (another installation) is not ours.
	foreign := payments.NewService(b.pool, payments.Config{Gateway: b.gw, Clock: b.clock, CodeSecret: []byte("another-secret")})
	fl, err := foreign.CheckoutLink(context.Background(), "o-signed", 1999, "EUR", 0)
	if err != nil {
		t.Fatal(err)
	}
	noPayForm(t, a, fl.Path(), http.StatusBadRequest)

	// The valid link: the Pay form, with the sig hidden in it.
	action, form := payForm(t, a, link)
	if form.Get("sig") != sig || form.Get("amount") != "1999" || form.Get("currency") != "EUR" || action != "/checkout/o-signed" {
		t.Fatalf("form %s %v", action, form)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("pages wrote %d sessions, %d registrations", n, b.gw.Calls(fakegw.OpRegister))
	}

	// Links are made under the service secret only when there is one: NewService's stand-in
	// secret is public, so a service without CodeSecret neither makes nor accepts links.
	unset := payments.NewService(b.pool, payments.Config{Gateway: b.gw, Clock: b.clock})
	if _, err := unset.CheckoutLink(context.Background(), "o-signed", 1999, "EUR", 0); payments.ErrorCode(err) != payments.EUNAVAIL {
		t.Fatalf("link without a secret: %v, want EUNAVAIL", err)
	}
	if unset.VerifyCheckoutLink("o-signed", 1999, "EUR", exp, payments.NoLinkGeneration, sig, "") == nil {
		t.Fatal("a service without a secret accepts a link")
	}
	// Input is validated like Create's.
	for _, in := range []struct {
		order    string
		amount   int64
		currency string
		field    string
	}{{"bad id", 1, "EUR", "order_id"}, {"o", 0, "EUR", "amount"}, {"o", 1, "eur", "currency"}} {
		var pe *payments.Error
		if _, err := b.svc.CheckoutLink(context.Background(), in.order, in.amount, in.currency, 0); !errors.As(err, &pe) || pe.Field != in.field {
			t.Errorf("link %v: %v, want invalid %s", in, err, in.field)
		}
	}
}

// TestCheckoutPayRefusesChangedForm: the Pay POST verifies the form's amount and currency again
// (its sig, or the order's last payment): a form edited in the browser is a 422 with a readable
// message, and nothing is created, neither a session nor a registration at the gateway.
func TestCheckoutPayRefusesChangedForm(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	action, form := payForm(t, a, b.link(t, "o-edit", 1999, "EUR"))

	for _, change := range []func(url.Values){
		func(f url.Values) { f.Set("amount", "1") },
		func(f url.Values) { f.Set("currency", "JPY") },
		func(f url.Values) { f.Del("sig") },
		func(f url.Values) { f.Set("sig", "") },
		func(f url.Values) { f.Set("amount", "1"); f.Del("sig") },
	} {
		changed := url.Values{}
		for k, v := range form {
			changed[k] = append([]string(nil), v...)
		}
		changed.Set("intent", uuid.NewString()) // a fresh click each time
		change(changed)
		doc := page(t, a.post(action, changed), http.StatusUnprocessableEntity)
		wantText(t, doc, "checkout-notice", "was changed")
		if doc.Find(testid("checkout-form")).Length() != 0 {
			t.Fatal("a refused form is answered with a Pay form")
		}
	}
	// Another order's form with this sig (and that order's page token): neither signs this
	// order, so it is not a form of this order's page: refused as a changed link (400), showing
	// nothing of the order.
	other := url.Values{}
	for k, v := range form {
		other[k] = v
	}
	noPay := page(t, a.post("/checkout/o-edit-2", other), http.StatusBadRequest)
	if noPay.Find(testid("checkout-bad-link")).Length() != 1 || noPay.Find(testid("checkout-form")).Length() != 0 {
		t.Fatal("another order's form: want the bad-link page without a form")
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("%d sessions, %d registrations after changed forms; want 0 and 0", n, b.gw.Calls(fakegw.OpRegister))
	}
	if n := b.count(t, `SELECT count(*) FROM checkout_intents`); n != 0 {
		t.Fatalf("%d intent keys taken by changed forms", n)
	}

	// The form as the page rendered it pays.
	rec := a.post(action, form)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location")[0] == '/' {
		t.Fatalf("Pay: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	var amount int64
	if err := b.pool.QueryRow(context.Background(), `SELECT amount FROM payment_sessions WHERE order_id = 'o-edit'`).Scan(&amount); err != nil || amount != 1999 {
		t.Fatalf("session amount %d %v", amount, err)
	}
}

func mustQuery(t testing.TB, link string) url.Values {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}

// TestCheckoutLinksExpire: a link works until its expiry (7 days by default), which its signature
// covers; after it, the page is the refusal page with 410 and no Pay form, and a Pay form
// rendered before the expiry but clicked after it creates nothing (410). The main before this
// change signed no expiry: a link worked forever.
func TestCheckoutLinksExpire(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	l, err := b.svc.CheckoutLink(context.Background(), "o-expiring", 1999, "EUR", 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := b.clock.Now().Add(7 * 24 * time.Hour); !l.ExpiresAt.Equal(want) {
		t.Fatalf("expires at %s, want %s (7 days)", l.ExpiresAt, want)
	}
	b.clock.Advance(7*24*time.Hour - time.Second)
	action, form := payForm(t, a, l.Path())
	if form.Get("exp") != strconv.FormatInt(l.ExpiresAt.Unix(), 10) {
		t.Fatalf("the Pay form does not carry the expiry: %v", form)
	}
	b.clock.Advance(time.Second)
	doc := noPayForm(t, a, l.Path(), http.StatusGone)
	wantText(t, doc, "checkout-expired", "expired")
	doc = page(t, a.post(action, form), http.StatusGone)
	wantText(t, doc, "checkout-expired", "expired")
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("an expired link created %d sessions, %d registrations", n, b.gw.Calls(fakegw.OpRegister))
	}
	// A lifetime of the shop's choosing, within bounds.
	short, err := b.svc.CheckoutLink(context.Background(), "o-expiring", 1999, "EUR", time.Hour)
	if err != nil || !short.ExpiresAt.Equal(b.clock.Now().Add(time.Hour)) {
		t.Fatalf("one-hour link = %+v %v", short, err)
	}
	for _, ttl := range []time.Duration{time.Second, 31 * 24 * time.Hour} {
		var pe *payments.Error
		if _, err := b.svc.CheckoutLink(context.Background(), "o-expiring", 1999, "EUR", ttl); !errors.As(err, &pe) || pe.Field != "expires_in" {
			t.Errorf("lifetime %s = %v, want invalid expires_in", ttl, err)
		}
	}
}

// A checkout link the shop has replaced with a newer one for another amount pays nothing: a
// customer holding the link from before the order was re-priced (or its Pay form, rendered
// before) is told the link was replaced (409) and nothing is started; the newest link pays. The
// page's "try again" of a payment declined at the old price is replaced too. A newer link of
// the same amount leaves older ones valid, and the shop's own API is not held to the price.
// Negative control (run by hand): without the claim's price check, the old form pays 100.00 and
// the order is paid at the old price.
func TestCheckoutReplacedLinkPaysNothing(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	old := b.link(t, "o-repriced", 10000, "EUR")
	sameAmount := b.link(t, "o-repriced", 10000, "EUR")
	action, form := payForm(t, a, old) // rendered while the link was current
	payForm(t, a, sameAmount)          // a second link of the same amount: both valid
	current := b.link(t, "o-repriced", 15000, "EUR")

	for _, l := range []string{old, sameAmount} {
		doc := noPayForm(t, a, l, http.StatusConflict)
		wantText(t, doc, "checkout-replaced", "was replaced")
	}
	doc := page(t, a.post(action, form), http.StatusConflict)
	wantText(t, doc, "checkout-replaced", "was replaced")
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("a replaced link started %d sessions, %d registrations", n, b.gw.Calls(fakegw.OpRegister))
	}
	action, form = payForm(t, a, current)
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("the current link's Pay: %d %s", rec.Code, rec.Body)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-repriced' AND amount = 15000`); n != 1 {
		t.Fatalf("sessions at the current price = %d", n)
	}

	// Declined at the old price, then re-priced: the page's "try again" (no link, the order's
	// page token) offers nothing, and its form rendered before pays nothing.
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	action, form = payForm(t, a, b.link(t, "o-declined-repriced", 500, "EUR"))
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("Pay: %d %s", rec.Code, rec.Body)
	}
	retryAction, retry := payForm(t, a, b.orderPage("o-declined-repriced", ""))
	b.link(t, "o-declined-repriced", 700, "EUR")
	doc = noPayForm(t, a, b.orderPage("o-declined-repriced", ""), http.StatusConflict)
	wantText(t, doc, "checkout-replaced", "was replaced")
	page(t, a.post(retryAction, retry), http.StatusConflict)
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-declined-repriced'`); n != 1 {
		t.Fatalf("the replaced retry started a payment: %d sessions", n)
	}

	// The shop's own API decides: a Create for another amount is not the checkout page's.
	if _, err := b.svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.CreateInput{OrderID: "o-declined-repriced", Amount: 650, Currency: "EUR"}); err != nil {
		t.Fatalf("the shop's Create: %v", err)
	}
}

// Clicks the claim refuses spend nothing: a replaced link's form (the shop re-priced the order)
// posted ten times with fresh keys, and clicks while a late payment is in review, wrote counted
// intent rows although no payment was started, so the customer's click on the current link (or
// "Try again" once finance resolved the case) was a 429 for an hour: anyone holding an old link
// could keep an order unpayable (checkout review, session 30, medium). Such clicks now write no
// row (checkoutStartAllowed: startsNothing). Negative control: without the price and in-review
// terms in checkoutStartAllowed, both customer clicks are 429.
func TestCheckoutClicksThatAreRefusedSpendNothing(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	ctx := context.Background()

	// A replaced link.
	const order = "o-dead-link"
	action, form := payForm(t, a, b.link(t, order, 1000, "EUR")) // rendered while the link was current
	current := b.link(t, order, 1200, "EUR")
	for i := range payments.CheckoutStartsPerHour {
		f := cloneForm(form)
		f.Set("intent", uuid.NewString())
		if rec := a.post(action, f); rec.Code != http.StatusConflict {
			t.Fatalf("replaced-link click %d: %d, want 409", i+1, rec.Code)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM checkout_intents WHERE order_id = $1`, order); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("the replaced link's clicks wrote %d intents, %d registrations", n, b.gw.Calls(fakegw.OpRegister))
	}
	b.clock.Advance(time.Minute)
	action, form = payForm(t, a, current)
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("the customer's click on the current link after the replaced link's clicks: %d (Retry-After %q), want 303", rec.Code, rec.Header().Get("Retry-After"))
	}

	// A late payment in review.
	const late = "o-late-budget"
	action, form, sid, _ := b.declinedClick(t, a, late)
	b.lateSuccess(t, late)
	for i := range payments.CheckoutStartsPerHour - 1 { // the first Pay click counted one
		f := cloneForm(form)
		f.Set("intent", uuid.NewString())
		if rec := a.post(action, f); rec.Code != http.StatusConflict {
			t.Fatalf("in-review click %d: %d, want 409", i+1, rec.Code)
		}
	}
	var caseID int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1`, sid).Scan(&caseID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ResolveCase(ctx, payments.Staff{Email: "fin@example.com", Role: "finance"}, caseID, "refunded by hand", ""); err != nil {
		t.Fatal(err)
	}
	retryAction, retry := payForm(t, a, b.orderPage(late, ""))
	if rec := a.post(retryAction, retry); rec.Code != http.StatusSeeOther {
		t.Fatalf("the customer's Try again after the case was resolved: %d, want 303", rec.Code)
	}
}
