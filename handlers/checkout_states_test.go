package handlers_test

import (
	"github.com/google/uuid"

	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/views"
)

// checkoutCase is one state of the checkout and the page that shows it.
type checkoutCase struct {
	state  string // views.Checkout…: the page's data-state
	testid string // the state's own component (its heading)
	path   string
	status int
	amount string // the order summary's amount ("" when the page can trust none)
	form   bool   // a Pay form (a fresh intent) is offered
	waits  bool   // the page looks again by itself (Refresh)
}

// checkoutStates prepares one order in each state of the checkout, through the core as the
// shop, the gateway and support would bring it there, and returns the page of each.
func (b *consoleBench) checkoutStates(t *testing.T) []checkoutCase {
	t.Helper()
	ctx := context.Background()
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	staff := payments.Actor{Kind: payments.ActorStaff, ID: "sup@example.com"}
	settle := func(order string, st payments.GatewayStatus) {
		t.Helper()
		s := b.payment(t, order, 1999)
		b.gw.SetStatus(s.GatewayPaymentID, st)
		if _, err := b.svc.Check(ctx, shop, s.ID); err != nil {
			t.Fatal(err)
		}
	}
	cancel := func(order string) payments.Session {
		t.Helper()
		s := b.payment(t, order, 1999)
		ch, err := b.svc.RequestCancel(ctx, staff, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		var body string
		if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1 ORDER BY id DESC LIMIT 1`, s.ID).Scan(&body); err != nil {
			t.Fatal(err)
		}
		res, err := b.svc.ConfirmCancel(ctx, staff, s.ID, ch.ID, codeRe.FindStringSubmatch(body)[1])
		if err != nil {
			t.Fatal(err)
		}
		return res.Session
	}

	// The declined and canceled orders were priced by a checkout link (still valid): their pages
	// may start another payment (payments.CheckoutRetry).
	b.link(t, "o-declined", 1999, "EUR")
	b.link(t, "o-canceled", 1999, "EUR")
	b.payment(t, "o-continue", 1999) // registered: waits for the customer at the gateway
	s := b.payment(t, "o-processing", 1999)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	settle("o-paid", payments.GatewaySucceeded)
	settle("o-declined", payments.GatewayDeclined)
	if s := cancel("o-canceled"); s.Status != payments.StatusCanceled {
		t.Fatalf("setup: canceled order is %s", s.Status)
	}
	b.gw.Fail(fakegw.OpReverse, fakegw.Transient, 1) // the reverse is not confirmed yet
	if s := cancel("o-canceling"); s.Status != payments.StatusCanceling {
		t.Fatalf("setup: canceling order is %s", s.Status)
	}
	// A genuine link made 8 days ago: its 7 days are up.
	past := payments.NewService(b.pool, payments.Config{Gateway: b.gw, CodeSecret: []byte("test-secret"),
		Clock: payments.NewManualClock(b.clock.Now().Add(-8 * 24 * time.Hour))})
	expired, err := past.CheckoutLink(ctx, "o-expired", 1999, "EUR", 0)
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(b.link(t, "o-changed", 1999, "EUR"), "amount=1999", "amount=1", 1)
	// Declined, then the gateway took the money after all: a late_payment case for finance.
	b.link(t, "o-late", 1999, "EUR")
	settle("o-late", payments.GatewayDeclined)
	b.lateSuccess(t, "o-late")

	return []checkoutCase{
		{views.CheckoutPay, "checkout-ready", b.link(t, "o-pay", 1999, "EUR"), http.StatusOK, "19.99 EUR", true, false},
		{views.CheckoutContinue, "checkout-waiting", b.orderPage("o-continue", ""), http.StatusOK, "19.99 EUR", false, false},
		{views.CheckoutConfirming, "checkout-confirming", b.orderPage("o-processing", ""), http.StatusOK, "19.99 EUR", false, true},
		{views.CheckoutPaid, "checkout-paid", b.orderPage("o-paid", ""), http.StatusOK, "19.99 EUR", false, false},
		{views.CheckoutDeclined, "checkout-declined", b.orderPage("o-declined", ""), http.StatusOK, "19.99 EUR", true, false},
		{views.CheckoutCanceling, "checkout-canceling", b.orderPage("o-canceling", ""), http.StatusOK, "19.99 EUR", false, true},
		{views.CheckoutCanceled, "checkout-canceled", b.orderPage("o-canceled", ""), http.StatusOK, "19.99 EUR", true, false},
		{views.CheckoutInReview, "checkout-in-review", b.orderPage("o-late", ""), http.StatusOK, "19.99 EUR", false, false},
		{views.CheckoutExpired, "checkout-expired", expired.Path(), http.StatusGone, "", false, false},
		{views.CheckoutBadLink, "checkout-bad-link", changed, http.StatusBadRequest, "", false, false},
	}
}

// noScriptsOrInlineStyles: a checkout page works without JavaScript and within the
// Content-Security-Policy (self only): no script at all, no inline style, no meta refresh (a
// waiting page refreshes through the Refresh header instead).
func noScriptsOrInlineStyles(t *testing.T, what string, doc *goquery.Document) {
	t.Helper()
	for _, sel := range []string{"script", "style", "[style]", `meta[http-equiv="refresh"]`, "[onclick],[onsubmit],[onload]"} {
		if n := doc.Find(sel).Length(); n != 0 {
			t.Errorf("%s: %d × %s", what, n, sel)
		}
	}
	if lang := doc.Find("html").AttrOr("lang", ""); lang != "en" {
		t.Errorf("%s: html lang %q", what, lang)
	}
}

// Every state of the checkout is its own component, on a page that names the merchant
// (MERCHANT_NAME) and sums the order up (its amount, once the page can trust one); forms only
// where the customer can pay (a fresh intent key each render), a self-refresh only where the
// page waits for the gateway, and nothing that needs JavaScript. The main before this change
// named no merchant, showed a declined or canceled payment as a plain Pay form with a notice,
// and refreshed with a meta tag.
func TestCheckoutStatesPages(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	cases := b.checkoutStates(t)
	for _, tc := range cases {
		a := b.agent(t)
		rec := a.get(tc.path)
		doc := page(t, rec, tc.status)
		what := tc.state + " " + tc.path
		if got := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); got != tc.state {
			t.Errorf("%s: state %q", what, got)
			continue
		}
		if doc.Find(testid(tc.testid)).Length() != 1 {
			t.Errorf("%s: no %s component", what, tc.testid)
		}
		if text(doc, "checkout-merchant") != testMerchant || text(doc, "checkout-summary-merchant") != testMerchant ||
			!strings.Contains(doc.Find("title").Text(), testMerchant) {
			t.Errorf("%s: merchant %q / %q, title %q", what, text(doc, "checkout-merchant"), text(doc, "checkout-summary-merchant"), doc.Find("title").Text())
		}
		if got := text(doc, "checkout-amount"); got != tc.amount {
			t.Errorf("%s: summary amount %q, want %q", what, got, tc.amount)
		}
		forms := doc.Find(testid("checkout-form"))
		if (forms.Length() == 1) != tc.form {
			t.Errorf("%s: %d Pay forms", what, forms.Length())
		}
		if tc.form {
			_, again := payForm(t, a, tc.path)
			if again.Get("intent") == "" || again.Get("intent") == forms.Find(`input[name="intent"]`).AttrOr("value", "") {
				t.Errorf("%s: the form's intent key is not fresh on each render", what)
			}
		}
		if refresh := rec.Header().Get("Refresh"); (refresh != "") != tc.waits {
			t.Errorf("%s: Refresh %q", what, refresh)
		}
		if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s: Cache-Control %q", what, cc)
		}
		noScriptsOrInlineStyles(t, what, doc)
	}
}

// An error on a checkout route is the customer's error page: the merchant's name, what to do in
// their words, a way back to the order where there is one, and no link into the staff console.
// The main before this change answered the console's error page ("Back to the console").
func TestCheckoutErrorPagesAreTheCustomers(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	check := func(rec *httptest.ResponseRecorder, status int, back string) *goquery.Document {
		t.Helper()
		doc := page(t, rec, status)
		if doc.Find(testid("checkout-error")).Length() != 1 || text(doc, "checkout-merchant") != testMerchant {
			t.Fatalf("%d: not the checkout's error page:\n%s", status, rec.Body)
		}
		if doc.Find(`a[href="/"]`).Length() != 0 || strings.Contains(strings.ToLower(rec.Body.String()), "console") {
			t.Errorf("%d: the customer's error page points into the console", status)
		}
		if got := doc.Find(testid("checkout-back")).AttrOr("href", ""); got != back {
			t.Errorf("%d: back link %q, want %q", status, got, back)
		}
		noScriptsOrInlineStyles(t, "error page", doc)
		return doc
	}
	check(a.get("/checkout/bad%20id"), http.StatusNotFound, "")

	// A Pay click whose CSRF cookie is gone (another browser window, cookies cleared): 403,
	// nothing created, and the way back to the page the form came from (TestCheckoutCSRFRefusalLeadsBackToTheForm).
	link := b.link(t, "o-csrf", 1999, "EUR")
	_, form := payForm(t, a, link)
	fresh := b.agent(t)
	fresh.get(b.orderPage("o-csrf", ""))
	doc := check(fresh.post("/checkout/o-csrf", form), http.StatusForbidden, link)
	wantText(t, doc, "error-title", "expired")
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 0 {
		t.Fatalf("a refused click created %d sessions", n)
	}

	var db string
	if err := b.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	restore := outage(t, db)
	rec := a.get(b.orderPage("o-csrf", ""))
	doc = check(rec, http.StatusServiceUnavailable, b.orderPage("o-csrf", ""))
	wantText(t, doc, "error-retry", "do not pay again") // a look: no claim about the money
	if got := doc.Find(testid("error-retry-link")).AttrOr("href", ""); got != b.orderPage("o-csrf", "") {
		t.Errorf("Try again leads to %q, want the order's page", got)
	}
	if rec.Header().Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	restore()
}

// The 403 of a Pay click refused by the CSRF check (its cookie gone: another window, cookies
// cleared) leads back to the page its form came from, as Pay's own refusals do: the checkout
// link the form carried (with its contact prefill), whose page offers Pay again. The order's
// page token would not do for an order with no payment yet: that page has no amount to offer
// without the link and says the link is incomplete or changed. A form that carried no link (the
// page's retry form after a decline) leads to the order's page with its token, which offers
// the retry; a form with a link that does not verify, to that token page too (never a link the
// server did not sign).
// Negative control (run by hand): with every POST led back to the order's page token (the
// error handler before this change), the link form's way back is the bad-link page.
func TestCheckoutCSRFRefusalLeadsBackToTheForm(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	refused := func(action string, form url.Values, back, state string) {
		t.Helper()
		cookieless := b.agent(t) // the form's CSRF cookie is not this browser's
		cookieless.get(b.orderPage("o-none", ""))
		doc := page(t, cookieless.post(action, form), http.StatusForbidden)
		if got := doc.Find(testid("checkout-back")).AttrOr("href", ""); got != back {
			t.Fatalf("403: the way back is %q, want %q", got, back)
		}
		doc = page(t, cookieless.get(back), http.StatusOK)
		if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != state || doc.Find(testid("checkout-form")).Length() != 1 {
			t.Fatalf("403's way back %s shows %q (%d Pay forms), want %q with a Pay form", back, st, doc.Find(testid("checkout-form")).Length(), state)
		}
	}

	// A link's form, the order with no payment yet.
	link := b.link(t, "o-csrf-link", 1999, "EUR")
	action, form := payForm(t, a, link+"&contact=cust@example.com")
	linkPage := mustQuery(t, link)
	linkPage.Set("contact", "cust@example.com")
	refused(action, form, payments.CheckoutPath("o-csrf-link")+"?"+linkPage.Encode(), views.CheckoutPay)
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 0 {
		t.Fatalf("refused clicks created %d sessions", n)
	}

	// The page's retry form after a decline (no link in it): the order's page with its token.
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	action, form = payForm(t, a, b.link(t, "o-csrf-retry", 500, "EUR"))
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("Pay: %d", rec.Code)
	}
	action, retry := payForm(t, a, b.orderPage("o-csrf-retry", ""))
	refused(action, retry, b.orderPage("o-csrf-retry", ""), views.CheckoutDeclined)

	// A link's form whose sig does not verify: not a link to lead to.
	forged := cloneForm(form)
	forged.Set("sig", strings.Repeat("0", 64))
	refused(action, forged, b.orderPage("o-csrf-retry", ""), views.CheckoutDeclined)
}

// lateSuccess has the gateway take the money for the order's last payment, settled Failed or
// Canceled already, and a Check find it: a late_payment case opens.
func (b *consoleBench) lateSuccess(t *testing.T, order string) payments.Session {
	t.Helper()
	ctx := context.Background()
	var sid, gpID string
	if err := b.pool.QueryRow(ctx, `SELECT id::text, gateway_payment_id FROM payment_sessions WHERE order_id = $1
		ORDER BY created_at DESC LIMIT 1`, order).Scan(&sid, &gpID); err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(gpID, payments.GatewaySucceeded)
	s, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, sid)
	if err != nil && payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment' AND resolved_at IS NULL`, sid); n != 1 {
		t.Fatalf("setup: %d open late_payment cases for %s", n, order)
	}
	return s
}

// The gateway takes the money for a payment pitlane has settled Failed (the customer finished
// 3-D Secure late, say): finance gets a late_payment case. The customer's page said "You have
// not been charged" and offered "Try again", a second charge of the order, and a stale tab's
// "Try again" form started one. Now the page says the bank reported the payment and offers no
// form, and the stale form's click is refused (409) with nothing sent to the gateway; once
// finance resolves the case (refunded by hand, say) the page may offer a new payment again.
// From the checkout review; negative control: without the page's PaymentInReview and the
// claim's check, the page is "declined" with a form and the stale click registers a second
// payment.
func TestCheckoutAfterALatePaymentOffersNoSecondCharge(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	ctx := context.Background()
	_, _, sid, _ := b.declinedClick(t, a, "o-late")
	retryAction, retryForm := payForm(t, a, b.orderPage("o-late", "")) // the "Try again" a tab keeps
	b.lateSuccess(t, "o-late")
	registered := b.gw.Calls(fakegw.OpRegister)

	doc := page(t, a.get(b.orderPage("o-late", "")), http.StatusOK)
	if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutInReview ||
		doc.Find(testid("checkout-form")).Length() != 0 || strings.Contains(doc.Text(), "not been charged") {
		t.Fatalf("after the late payment: state %q, %d forms: %q", st, doc.Find(testid("checkout-form")).Length(),
			strings.Join(strings.Fields(doc.Find(testid("checkout-state")).Text()), " "))
	}
	doc = page(t, a.post(retryAction, retryForm), http.StatusConflict)
	if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutInReview {
		t.Errorf("the stale form's click: state %q", st)
	}
	if n := b.gw.Calls(fakegw.OpRegister) - registered; n != 0 {
		t.Fatalf("the stale Try again registered %d payments at the gateway: a second charge", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-late'`); n != 1 {
		t.Fatalf("%d sessions of the order", n)
	}

	// Finance refunds it by hand and resolves the case: the order may be paid again.
	var caseID int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1`, sid).Scan(&caseID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ResolveCase(ctx, payments.Staff{Email: "fin@example.com", Role: "finance"}, caseID, "refunded at the gateway by hand", ""); err != nil {
		t.Fatal(err)
	}
	doc = page(t, a.get(b.orderPage("o-late", "")), http.StatusOK)
	if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutDeclined || doc.Find(testid("checkout-retry")).Length() != 1 {
		t.Fatalf("after the case was resolved: state %q, %d retry forms", st, doc.Find(testid("checkout-retry")).Length())
	}
}

// A stale tab's Pay after the shop started a payment for another amount over the API: the 409
// page's notice named the amount in minor units ("2500 EUR" under a summary of 25.00 EUR; "1500
// KWD" for 1.500 KWD) and the payment's internal id. Now the customer's words. From the checkout
// review; negative control: the API's message ("already has an active payment <id> for 2500 EUR").
func TestCheckoutConflictNoticeSpeaksTheCustomersAmount(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	for _, c := range []struct {
		order            string
		link, api        int64
		cur, want, wrong string
	}{
		{"o-conflict-eur", 1999, 2500, "EUR", "25.00 EUR", "2500 EUR"},
		{"o-conflict-kwd", 1000, 1500, "KWD", "1.500 KWD", "1500 KWD"},
	} {
		action, form := payForm(t, a, b.link(t, c.order, c.link, c.cur))
		s, err := b.svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
			payments.CreateInput{OrderID: c.order, Amount: c.api, Currency: c.cur})
		if err != nil {
			t.Fatal(err)
		}
		doc := page(t, a.post(action, form), http.StatusConflict)
		notice := text(doc, "checkout-notice")
		if strings.Contains(notice, c.wrong) || !strings.Contains(notice, c.want) || strings.Contains(notice, s.Session.ID) {
			t.Errorf("%s: the notice says %q: want the amount as %q, no %q and no payment id", c.order, notice, c.want, c.wrong)
		}
	}
}

// The bank reports a late payment of the order's first payment while the customer's retry (a
// second payment) is at the bank's page: the order's page — where the gateway sends customers
// back — said "You have not been charged yet" and offered "Continue to the payment page" for the
// second payment, and a Pay click (a new tab of the link) was answered with it: a second charge
// while the bank held the first (checkout review, session 30). Now the page is in review with no
// way to the bank, and the click is refused (409 in review). Negative control: without the page's
// check and the claim's order (late review before the active payment) the page is "continue"
// and the click leads to the second payment's bank page.
func TestCheckoutOffersNoActivePaymentWhileALateOneIsInReview(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	ctx := context.Background()
	const order = "o-late-retry"
	action, form, s1, gp1 := b.declinedClick(t, a, order)
	retryAction, retry := payForm(t, a, b.orderPage(order, ""))
	rec := a.post(retryAction, retry)
	if rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "https://") {
		t.Fatalf("Try again: %d %s", rec.Code, rec.Header().Get("Location"))
	}
	// The bank took the money for the first payment after all.
	b.gw.SetStatus(gp1, payments.GatewaySucceeded)
	if _, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s1); err != nil && payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment' AND resolved_at IS NULL`, s1); n != 1 {
		t.Fatalf("setup: %d open late_payment cases", n)
	}
	b.clock.Advance(payments.PageLookEvery)
	doc := page(t, a.get(b.orderPage(order, "")), http.StatusOK)
	if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutInReview || strings.Contains(doc.Text(), "not been charged") {
		t.Fatalf("the bank holds the first payment's money, yet the page is %q: %q",
			st, strings.Join(strings.Fields(doc.Find(testid("checkout-state")).Text()), " "))
	}
	// The first tab's Pay form clicked again (a new click: a fresh intent key): refused, not
	// sent to the second payment's bank page.
	form.Set("intent", uuid.NewString())
	doc = page(t, a.post(action, form), http.StatusConflict)
	if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutInReview {
		t.Errorf("a new click while the late payment is in review: state %q", st)
	}
	noWayToTheBank(t, b, a, order, retryAction, retry)
}

// noWayToTheBank checks that the click (action, form) already made for order, sent again, and
// its follow-up page (where a double click's second request lands, kept in the browser's
// history) show the order's page in review and send nobody to a payment's page at the bank.
// They did while the order's own page refused the way there (an outside review).
func noWayToTheBank(t *testing.T, b *consoleBench, a *agent, order, action string, form url.Values) {
	t.Helper()
	follow := b.svc.OrderPagePath(order, url.Values{"intent": {form.Get("intent")}})
	for what, rec := range map[string]*httptest.ResponseRecorder{
		"the click's follow-up page": a.get(follow),
		"the click sent again":       a.post(action, form),
	} {
		for rec.Code == http.StatusSeeOther && strings.HasPrefix(rec.Header().Get("Location"), "/checkout/") {
			rec = a.get(rec.Header().Get("Location"))
		}
		if rec.Code == http.StatusSeeOther {
			t.Errorf("%s: 303 to %s, a payment's page at the bank", what, rec.Header().Get("Location"))
			continue
		}
		if st := page(t, rec, rec.Code).Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutInReview {
			t.Errorf("%s: %d, state %q", what, rec.Code, st)
		}
	}
}

// The gateway answers that the customer's payment succeeded, for 19.90 of a 19.99 session: the
// answer is not applied (the session stays Registered, flagged, a gateway_mismatch case opens),
// and the customer's return page said "You have not been charged yet" with the way back to the
// bank's page, while the gateway held the money. The page is in review now, a new click starts
// nothing (409, nothing registered), and the click and its follow-up page send nobody to the
// bank. From an outside review; negative control: paymentInReviewSQL without gateway_mismatch
// (the page is "continue").
func TestCheckoutPaymentTakenAtAnotherAmountIsInReview(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	const order = "o-other-amount"
	action, form, sid, gp := b.clicked(t, a, order)
	b.gw.SetStatus(gp, payments.GatewaySucceeded)
	b.gw.SetAmount(gp, 1990, "EUR")
	b.clock.Advance(payments.PageLookEvery)
	doc := page(t, a.get(b.orderPage(order, "/return")), http.StatusOK)
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL`, sid); n != 1 {
		t.Fatalf("setup: %d open gateway_mismatch cases", n)
	}
	if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutInReview || strings.Contains(doc.Text(), "not been charged") {
		t.Fatalf("the gateway holds 19.90 of the customer's, yet the return page is %q: %q",
			st, strings.Join(strings.Fields(doc.Find(testid("checkout-state")).Text()), " "))
	}
	registered := b.gw.Calls(fakegw.OpRegister)
	fresh := maps.Clone(form)
	fresh.Set("intent", uuid.NewString())
	if st := page(t, a.post(action, fresh), http.StatusConflict).Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutInReview {
		t.Errorf("a new click: state %q", st)
	}
	if n := b.gw.Calls(fakegw.OpRegister) - registered; n != 0 {
		t.Errorf("a new click registered %d payments at the gateway", n)
	}
	noWayToTheBank(t, b, a, order, action, form)
}

// clicked pays the order (19.99 EUR) through a new link's form: the customer is at the bank's
// page. It returns the form (for more clicks) and the payment's session and gateway ids.
func (b *consoleBench) clicked(t *testing.T, a *agent, order string) (action string, form url.Values, sessionID, gatewayID string) {
	t.Helper()
	action, form = payForm(t, a, b.link(t, order, 1999, "EUR"))
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("Pay: %d", rec.Code)
	}
	if err := b.pool.QueryRow(context.Background(), `SELECT id::text, gateway_payment_id FROM payment_sessions WHERE order_id = $1`, order).
		Scan(&sessionID, &gatewayID); err != nil {
		t.Fatal(err)
	}
	return action, form, sessionID, gatewayID
}

// declinedClick pays the order through a new link's form, then the gateway lets the payment
// expire and the customer's return shows it Failed. It returns the form (for more clicks) and
// the payment's session and gateway ids.
func (b *consoleBench) declinedClick(t *testing.T, a *agent, order string) (action string, form url.Values, sessionID, gatewayID string) {
	t.Helper()
	action, form, sessionID, gatewayID = b.clicked(t, a, order)
	b.gw.SetStatus(gatewayID, payments.GatewayExpired)
	b.clock.Advance(payments.PageLookEvery)
	wantText(t, page(t, a.get(b.orderPage(order, "/return")), http.StatusOK), "checkout-status", "Failed")
	return action, form, sessionID, gatewayID
}

// The bank reports a late payment of the order's declined payment (an open late_payment case:
// the gateway holds the customer's money) and then the link's time runs out. A Pay click from
// a tab the customer kept — the order page's "Try again", or the link's own Pay form rendered
// before — was refused as "expired", and the refusal page told the customer "Nothing was
// charged" and to get a new link from the shop, while the bank held their money (an outside
// review, checkout). The click's answer is the order as it is: in review, 409.
func TestAnExpiredClickOnAnOrderInReviewShowsTheReview(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	const order = "o-late-expired"
	linkAction, _, _, _ := b.declinedClick(t, a, order)
	_, linkForm := payForm(t, a, b.link(t, order, 1999, "EUR"))     // a fresh tab of the link: its own key
	retryAction, retryForm := payForm(t, a, b.orderPage(order, "")) // the "Try again" a tab keeps
	b.lateSuccess(t, order)
	registered := b.gw.Calls(fakegw.OpRegister)

	// The links' time runs out (the default lifetime).
	b.clock.Advance(payments.DefaultCheckoutLinkTTL + payments.PageLookEvery)

	// The order's page says where the money is: in review.
	doc := page(t, a.get(b.orderPage(order, "")), http.StatusOK)
	if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutInReview {
		t.Fatalf("the order's page: state %q, want in review", st)
	}

	for _, c := range []struct {
		name, action string
		form         map[string][]string
	}{
		{"the page's Try again", retryAction, retryForm},
		{"the link's Pay form", linkAction, linkForm},
	} {
		rec := a.post(c.action, c.form)
		body := rec.Body.String()
		doc := page(t, rec, rec.Code)
		st := doc.Find(testid("checkout-state")).AttrOr("data-state", "")
		if st != views.CheckoutInReview || strings.Contains(body, "Nothing was charged") {
			t.Errorf("%s after expiry, while the bank holds the money: %d, state %q, says %q",
				c.name, rec.Code, st, strings.Join(strings.Fields(doc.Find("main").Text()), " "))
		}
	}
	if n := b.gw.Calls(fakegw.OpRegister) - registered; n != 0 {
		t.Fatalf("%d registrations", n)
	}
}
