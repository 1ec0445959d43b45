package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/views"
)

// cloneForm copies a form so a test may change it.
func cloneForm(f url.Values) url.Values {
	c := url.Values{}
	for k, v := range f {
		c[k] = append([]string(nil), v...)
	}
	return c
}

// The page's "Try again" after a decline (the order's page token, which never expires, and the
// last payment's amount) ends with the link that priced the order: an hour after a one-hour
// link, the link is a 410 and so is the order's page — no retry form, and the retry form
// rendered before starts nothing. A newer link at the same price opens it again. An order paid
// over the API only (no link ever priced it) tells its story without a retry form, and a retry
// posted anyway starts nothing.
// Negative control (run by hand): with payable and Pay not asking CheckoutRetry (the retry as
// before: any time, any order), the page offers "Try again" after the hour, its form makes a
// second session, and the API-only order's page offers one too.
func TestCheckoutRetryEndsWithItsLink(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	ctx := context.Background()
	sessions := func(order string) int {
		return b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, order)
	}

	l, err := b.svc.CheckoutLink(ctx, "o-hour", 1999, "EUR", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1) // declined at the gateway
	action, form := payForm(t, a, l.Path())
	doc := page(t, a.follow(a.post(action, form)), http.StatusOK)
	wantText(t, doc, "checkout-declined", "did not go through")
	retryAction, retry := payForm(t, a, b.orderPage("o-hour", "")) // within the hour: offered
	if retry.Has("sig") || retry.Get("amount") != "1999" {
		t.Fatalf("retry form %v", retry)
	}

	b.clock.Advance(time.Hour)
	doc = noPayForm(t, a, l.Path(), http.StatusGone)
	wantText(t, doc, "checkout-expired", "expired")
	doc = noPayForm(t, a, b.orderPage("o-hour", ""), http.StatusGone)
	wantText(t, doc, "checkout-expired", "expired")
	doc = page(t, a.post(retryAction, retry), http.StatusGone)
	wantText(t, doc, "checkout-expired", "expired")
	if n, r := sessions("o-hour"), b.gw.Calls(fakegw.OpRegister); n != 1 || r != 1 {
		t.Fatalf("the retry after the link's hour: %d sessions, %d registrations; want 1 and 1", n, r)
	}

	// The shop sends the customer a new link at the same price: the page retries again.
	b.link(t, "o-hour", 1999, "EUR")
	retryAction, retry = payForm(t, a, b.orderPage("o-hour", ""))
	if rec := a.post(retryAction, retry); rec.Code != http.StatusSeeOther || rec.Header().Get("Location")[0] == '/' {
		t.Fatalf("the retry under the new link: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	if n := sessions("o-hour"); n != 2 {
		t.Fatalf("%d sessions after the retry under the new link, want 2", n)
	}

	// Paid over the API only, declined: the page says what happened and where to go, no form.
	s := b.payment(t, "o-api", 1999)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayDeclined)
	if _, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	doc = noPayForm(t, a, b.orderPage("o-api", ""), http.StatusOK)
	wantText(t, doc, "checkout-declined", "did not go through")
	wantText(t, doc, "checkout-ask-shop", "go back to "+testMerchant)
	forged := url.Values{"intent": {uuid.NewString()}, "amount": {"1999"}, "currency": {"EUR"},
		payments.OrderPageParam: {b.svc.OrderPageToken("o-api")}, "csrf_token": {retry.Get("csrf_token")}}
	doc = page(t, a.post("/checkout/o-api", forged), http.StatusConflict)
	wantText(t, doc, "checkout-notice", "only from the shop")
	if doc.Find(testid("checkout-form")).Length() != 0 {
		t.Fatal("the refused retry is answered with a Pay form")
	}
	if n := sessions("o-api"); n != 1 {
		t.Fatalf("a retry of an order no link priced started a payment: %d sessions", n)
	}
}

// A resubmit of the Pay form just after its link expired, while the first click is registering
// the payment at the gateway (parked in BeforeRegister, where the clock passes the expiry), is
// that click: it goes to the follow-up page ("we are preparing your payment"), not to "this link
// has expired, nothing was charged"; after the first request it reaches the same payment page.
// A new click of the expired form still starts nothing. The same holds for the page's retry
// form once the link that allowed it expires.
// Negative control (run by hand): with Pay refusing an expired form before looking its key up,
// the resubmit is a 410 "expired" while the payment is being registered.
func TestCheckoutResubmitAfterExpiryFollowsTheClick(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	var during func() // runs once inside the next registration, in the request's goroutine
	_, e := b.replica(b.pool, "replica-late", b.gw, func(c *payments.Config) {
		c.Hooks.BeforeRegister = func(context.Context, string) {
			if f := during; f != nil {
				during = nil
				f()
			}
		}
	})
	a := newAgent(t, e)
	ctx := context.Background()

	// click posts form while inside its registration the clock passes the expiry and the
	// same form is sent again; it returns the first answer and the resubmit's.
	click := func(action string, form url.Values, pastExpiry time.Duration) (first, again *http.Response) {
		t.Helper()
		var resubmit *http.Response
		during = func() {
			b.clock.Advance(pastExpiry)
			resubmit = a.post(action, form).Result()
		}
		first = a.post(action, form).Result()
		if resubmit == nil {
			t.Fatal("the click never registered")
		}
		return first, resubmit
	}
	// The follow-up page: the click's key, and the link the form came from (none for a retry form).
	wantFollow := func(what string, r *http.Response, order string, form url.Values) {
		t.Helper()
		q := url.Values{"intent": {form.Get("intent")}}
		for _, k := range payments.CheckoutLinkParams {
			if form.Has("sig") && form.Get(k) != "" {
				q.Set(k, form.Get(k))
			}
		}
		if want := b.svc.OrderPagePath(order, q); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != want {
			t.Fatalf("%s: %d %q, want 303 to the follow-up page %q", what, r.StatusCode, r.Header.Get("Location"), want)
		}
	}

	l, err := b.svc.CheckoutLink(ctx, "o-late", 1999, "EUR", payments.MinCheckoutLinkTTL)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(payments.MinCheckoutLinkTTL - time.Second)
	action, form := payForm(t, a, l.Path())
	first, again := click(action, form, 2*time.Second)
	wantFollow("the resubmit while registering", again, "o-late", form)
	confirm := first.Header.Get("Location")
	if first.StatusCode != http.StatusSeeOther || confirm == "" || confirm[0] == '/' {
		t.Fatalf("the first request: %d %q, want the gateway's page", first.StatusCode, confirm)
	}
	// After it, the same click (the link expired) replays: the gateway's page again.
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != confirm {
		t.Fatalf("the resubmit after: %d %q, want %q", rec.Code, rec.Header().Get("Location"), confirm)
	}
	// A new click of the expired form starts nothing: the order's payment under way is shown
	// (the way to the gateway's page), not "expired, nothing was charged" alone.
	fresh := cloneForm(form)
	fresh.Set("intent", uuid.NewString())
	wantText(t, page(t, a.post(action, fresh), http.StatusConflict), "checkout-notice", "under way already")
	if n, r := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-late'`), b.gw.Calls(fakegw.OpRegister); n != 1 || r != 1 {
		t.Fatalf("%d sessions, %d registrations; want 1 and 1", n, r)
	}

	// The page's retry form, clicked a second before the link that priced the order expires.
	l, err = b.svc.CheckoutLink(ctx, "o-late-retry", 500, "EUR", payments.MinCheckoutLinkTTL)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	action, form = payForm(t, a, l.Path())
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("Pay: %d", rec.Code)
	}
	b.clock.Advance(payments.MinCheckoutLinkTTL - time.Second)
	action, retry := payForm(t, a, b.orderPage("o-late-retry", ""))
	_, again = click(action, retry, 2*time.Second)
	wantFollow("the retry's resubmit while registering", again, "o-late-retry", retry)
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-late-retry'`); n != 2 {
		t.Fatalf("%d sessions, want 2 (the declined one and the retry)", n)
	}
}

// A Pay click the core refuses is answered with the page the form came from, never with the
// bad-link page for a genuine link: an invalid contact or a damaged intent key → 422 with the
// link's own page (its Pay form again) and what went wrong. A lock timeout ("the payment is
// busy") → 503 with Retry-After, on the customer's error page whose "Try again" and way back
// lead to the link's page (or, for the page's retry form, to the order's page with its token),
// not to the POST's bare URL.
// Negative control (run by hand): with Pay's old answers (show() from the POST, EUNAVAIL as
// 409), the refusals show the bad-link state and the lock timeout is a 409 without
// Retry-After; with the error page's `<a href="">`, "Try again" leads nowhere.
func TestCheckoutPayRefusalsLeadBackToTheOrder(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	_, e := b.replica(b.pool, "replica-busy", b.gw, func(c *payments.Config) { c.LockTimeout = 50 * time.Millisecond })
	a := newAgent(t, e)
	ctx := context.Background()

	link := b.link(t, "o-refused", 1999, "EUR")
	action, form := payForm(t, a, link+"&contact=cust@example.com")
	for _, change := range []func(url.Values){
		func(f url.Values) { f.Set("contact", "cust\u200b@example.com") }, // an invisible character
		func(f url.Values) { f.Set("intent", "not-a-key") },
	} {
		changed := cloneForm(form)
		change(changed)
		doc := page(t, a.post(action, changed), http.StatusUnprocessableEntity)
		if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != "pay" {
			t.Fatalf("a refused genuine link's page is %q, want the link's Pay page", st)
		}
		if text(doc, "checkout-notice") == "" || doc.Find(testid("checkout-form")).Length() != 1 {
			t.Fatal("the refusal names no reason or offers no Pay form")
		}
		if got := doc.Find(`[data-testid="checkout-form"] input[name="sig"]`).AttrOr("value", ""); got != form.Get("sig") {
			t.Fatalf("the page's form carries sig %q, want the link's", got)
		}
	}

	// The order is locked by another claim past the lock timeout.
	hold := func(order string) (release func()) {
		t.Helper()
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(payments.LockCreateOrder), order); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
		t.Cleanup(release) // before the pool closes, also when the test fails holding it
		return release
	}
	busy := func(action string, form url.Values, back string) {
		t.Helper()
		rec := a.post(action, form)
		doc := page(t, rec, http.StatusServiceUnavailable)
		if rec.Header().Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
		wantText(t, doc, "error-retry", "nothing was charged by this click")
		// The click may be a resubmit of one whose payment the customer approved at the bank
		// before the outage: "nothing was charged" alone would be untrue for them.
		wantText(t, doc, "error-retry", "do not pay again")
		if got := doc.Find(testid("error-retry-link")).AttrOr("href", ""); got != back {
			t.Errorf("Try again leads to %q, want %q", got, back)
		}
		if got := doc.Find(testid("checkout-back")).AttrOr("href", ""); got != back {
			t.Errorf("the way back is %q, want %q", got, back)
		}
		if doc := page(t, a.get(back), http.StatusOK); doc.Find(testid("checkout-form")).Length() != 1 {
			t.Errorf("Try again (%s) offers no Pay form", back)
		}
	}
	linkPage := mustQuery(t, link)
	linkPage.Set("contact", "cust@example.com")
	release := hold("o-refused")
	busy(action, form, payments.CheckoutPath("o-refused")+"?"+linkPage.Encode())
	release()
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-refused'`); n != 0 {
		t.Fatalf("the busy click created %d sessions", n)
	}
	// The same click once the lock is gone goes through: its key was let go.
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther || rec.Header().Get("Location")[0] == '/' {
		t.Fatalf("the click after the lock: %d %q", rec.Code, rec.Header().Get("Location"))
	}

	// The page's retry form: back to the order's page with its token.
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	action, form = payForm(t, a, b.link(t, "o-refused-retry", 500, "EUR"))
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("Pay: %d", rec.Code)
	}
	action, retry := payForm(t, a, b.orderPage("o-refused-retry", ""))
	release = hold("o-refused-retry")
	busy(action, retry, b.orderPage("o-refused-retry", ""))
	release()
}

// A double click on a first visit's Pay: the browser shows the second request's answer, the
// order's page following the click (?intent=…&view=…, no link in it). The first request then
// fails without a session (the database drops its connection mid-claim: a 503 "nothing was
// charged, try again" for that request). The page the customer is looking at refreshes and
// now says "This payment link is incomplete or was changed" (400) — about the shop's genuine,
// unexpired link — with no way to pay, where the click's own answer offers to try again. The
// follow-up URL carries the form's link now. From the checkout review; negative control: with
// follow naming only the click's key, the page is 400 bad-link.
func TestADoubleClicksFollowPageKeepsTheLinkWhenTheClickFails(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	var (
		a      *agent
		action string
		form   map[string][]string
		second *http.Response
		follow string
		fired  bool
	)
	_, e := b.replica(b.pool, "replica-hook", b.gw, func(c *payments.Config) {
		c.Hooks.AfterClaimRead = func(ctx context.Context, order string) {
			if order != "o-dbl-fail" || fired {
				return
			}
			fired = true
			// The second click of the double click, while the first is inside its claim.
			rec := a.post(action, form)
			second = rec.Result()
			follow = rec.Header().Get("Location")
			// The first click's connection is dropped (a failover, a proxy restart): the holder of
			// an advisory lock in this test's database only — pg_locks is the cluster's, and the
			// parallel tests' databases share it (unfiltered, this killed their lock holders).
			if _, err := b.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_locks
				WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()
				  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
				t.Error(err)
			}
		}
	})
	a = newAgent(t, e)
	link := b.link(t, "o-dbl-fail", 1999, "EUR")
	action, form = payForm(t, a, link)
	first := a.post(action, form)
	t.Logf("first click: %d; second click: %d to %q", first.Code, second.StatusCode, follow)
	if second.StatusCode != http.StatusSeeOther || !strings.Contains(follow, "intent=") {
		t.Fatalf("the second click did not follow the first: %d %q", second.StatusCode, follow)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-dbl-fail'`); n != 0 {
		t.Fatalf("the first click made a session after all (%d): the test's interleaving did not happen", n)
	}
	rec := a.get(follow)
	doc := page(t, rec, rec.Code)
	state := doc.Find(testid("checkout-state")).AttrOr("data-state", "")
	t.Logf("the page the customer sees: %d, state %q: %q", rec.Code, state,
		strings.Join(strings.Fields(doc.Find(testid("checkout-state")).Text()), " "))
	if rec.Code != http.StatusOK || state != views.CheckoutPay || doc.Find(testid("checkout-pay")).Length() != 1 {
		t.Errorf("a genuine, unexpired link's page after the failed click: %d %q, want the Pay form again", rec.Code, state)
	}
}
