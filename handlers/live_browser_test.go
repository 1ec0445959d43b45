package handlers_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/handlers"
	"pitlane/live"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Chromium watching pages update themselves: server-sent events from the live hub, the page's
// region fetched again and swapped in place. Each test marks the window first; a reload would
// lose the mark.

// openLive loads a page, waits until its live stream is open, and marks the window.
func openLive(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	within(t, ctx, 20*time.Second, chromedp.Navigate(url))
	waitJS(t, ctx, "the page's live stream to open", `document.documentElement.getAttribute("data-live-state") === "live"`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.pitlaneMarker = "no reload"`)); err != nil {
		t.Fatal(err)
	}
}

// waitJS waits until the expression is true in the page.
func waitJS(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(tctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		html, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("waiting for %s: %v\n%s", what, err, html)
	}
}

// waitStatus waits until the element's text is want.
func waitStatus(t *testing.T, ctx context.Context, selector, want string) {
	t.Helper()
	waitJS(t, ctx, selector+" to read "+want, `(() => { const e = document.querySelector('`+selector+`'); return !!e && e.textContent.trim() === "`+want+`"; })()`)
}

func noReload(t *testing.T, ctx context.Context) {
	t.Helper()
	marker, err := chromedp.Run(ctx, chromedp.Evaluate[string](`String(window.pitlaneMarker)`))
	if err != nil || marker != "no reload" {
		t.Fatalf("the page was reloaded instead of updated in place (marker %q, %v)", marker, err)
	}
}

// TestBrowserLivePaymentPage: support has a payment open while the customer pays: the status
// goes Registered → Completed and the timeline gains the change, with no reload. Then another
// payment is canceled with the customer's code while support watches: Canceling shows while the
// gateway is still reversing, Canceled once it confirmed, again with no reload.
func TestBrowserLivePaymentPage(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	paid := b.payment(t, "o-live-paid", 1999)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	csp := watchCSP(t, ctx)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	bg := context.Background()
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}

	openLive(t, ctx, srv.URL+"/payments/"+paid.ID)
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Registered")
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(bg, shop, paid.ID); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Completed")
	waitJS(t, ctx, "the timeline's new row", `[...document.querySelectorAll('[data-testid="event-change"]')].some(e => e.textContent.replace(/\s+/g, " ").trim() === "Registered → Completed")`)
	noReload(t, ctx)
	screenshot(t, ctx, "payment-live-completed.png")

	canceled := b.payment(t, "o-live-cancel", 2500)
	openLive(t, ctx, srv.URL+"/payments/"+canceled.ID)
	staff := payments.Actor{Kind: payments.ActorStaff, ID: "sup@example.com"}
	ch, err := b.svc.RequestCancel(bg, staff, canceled.ID)
	if err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the cancel code's row", `document.querySelectorAll('[data-testid="challenge-row"]').length === 1`)
	var body string
	if err := b.pool.QueryRow(bg, `SELECT body FROM outbox WHERE payment_id = $1 ORDER BY id DESC LIMIT 1`, canceled.ID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	m := outboxCodeRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no code in %q", body)
	}
	gate := b.gw.Hold(fakegw.OpReverse)
	defer gate.Open()
	confirmed := make(chan error, 1)
	go func() {
		_, err := b.svc.ConfirmCancel(bg, staff, canceled.ID, ch.ID, m[1])
		confirmed <- err
	}()
	mustWaitC(t, gate.Arrived(), "the reverse at the gateway")
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Canceling")
	noReload(t, ctx)
	screenshot(t, ctx, "payment-live-canceling.png")
	gate.Open()
	if err := mustWaitC(t, confirmed, "the confirmed cancel"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Canceled")
	waitStatus(t, ctx, `[data-testid="reverse-status"]`, "Succeeded")
	noReload(t, ctx)
	screenshot(t, ctx, "payment-live-canceled.png")
	if v := csp(); len(v) > 0 {
		t.Fatalf("the browser refused content under the Content-Security-Policy:\n%s", strings.Join(v, "\n"))
	}
}

// A page the browser's back/forward cache kept and shows again: live.js closed its stream when
// the page was left and never opened another, so the restored page said "live" and showed
// what it showed when left, for good (carried from several reviews). Headless Chromium does not
// keep these no-store pages, so the test plays the two events the browser sends.
func TestBrowserLivePageShownAgainFromTheCacheCatchesUp(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	p := b.payment(t, "o-live-bfcache", 1999)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/payments/"+p.ID)
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Registered")

	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.dispatchEvent(new PageTransitionEvent("pagehide", {persisted: true}))`)); err != nil {
		t.Fatal(err)
	}
	// While the page is away (in the cache) the customer pays.
	b.gw.SetStatus(p.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, p.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.dispatchEvent(new PageTransitionEvent("pageshow", {persisted: true}))`)); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Completed")
	// live.js marks the page "connecting" when it is shown again: "live" is a new stream's open.
	waitJS(t, ctx, "the page's live stream to open again", `document.documentElement.getAttribute("data-live-state") === "live"`)
	noReload(t, ctx)
}

// TestBrowserLivePaymentsList: the payments list gains a new payment at the top and shows it
// complete, with no reload.
func TestBrowserLivePaymentsList(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	b.payment(t, "o-list-old", 1000)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	csp := watchCSP(t, ctx)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/payments")

	// A minute later, so the new payment is the newest by created_at (the list's order); at the
	// same instant the tie falls to the ids, which are random, and the row would be on top half
	// the time.
	b.clock.Advance(time.Minute)
	s := b.payment(t, "o-list-new", 4200)
	row := `[data-testid="payment-row"][data-id="` + s.ID + `"]`
	waitJS(t, ctx, "the new payment's row on top", `(() => { const r = document.querySelector('[data-testid="payment-row"]'); return !!r && r.getAttribute("data-id") === "`+s.ID+`"; })()`)
	waitStatus(t, ctx, row+` [data-testid="payment-status"]`, "Registered")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, row+` [data-testid="payment-status"]`, "Completed")
	noReload(t, ctx)
	screenshot(t, ctx, "payments-live.png")
	if v := csp(); len(v) > 0 {
		t.Fatalf("the browser refused content under the Content-Security-Policy:\n%s", strings.Join(v, "\n"))
	}
}

// TestBrowserLiveRefreshDoesNotEatTypedInput: a live refresh fetched before someone started
// typing arrives after they did: its answer is not swapped in over the typed value (it would
// throw it away, or detach the button being clicked: a support refund code typed and lost). The
// live refresh's request is held at the server while the value is typed, then let go.
func TestBrowserLiveRefreshDoesNotEatTypedInput(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.completed(t, "o-live-typing", 2500)
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	srv := b.server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(handlers.LiveHeader) == "1" {
			held <- struct{}{}
			<-release
		}
		b.e.ServeHTTP(w, r)
	}))
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/payments/"+s.ID)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		window.liveAnswers = 0;
		document.addEventListener("htmx:afterRequest", () => { window.liveAnswers++; });
		return true; })()`)); err != nil {
		t.Fatal(err)
	}

	// Something on the page changes: the stream says refresh, the region is fetched (and held).
	if _, err := b.svc.CreateRefund(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.RefundInput{PaymentID: s.ID, Amount: 100}); err != nil {
		t.Fatal(err)
	}
	mustWaitC(t, held, "the live refresh's request")
	// Meanwhile support types a reason into the refund form.
	const typed = "customer returned one item"
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		const e = document.querySelector('[data-testid="refund-reason"]');
		e.value = "`+typed+`"; return true; })()`)); err != nil {
		t.Fatal(err)
	}
	close(release)
	waitJS(t, ctx, "the live refresh's answer", `window.liveAnswers >= 1`)
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('[data-testid="refund-reason"]').value`))
	if err != nil {
		t.Fatal(err)
	}
	if got != typed {
		t.Fatalf("after the live refresh the reason reads %q, want what was typed", got)
	}
	noReload(t, ctx)
}

// TestBrowserRefusedProposalKeepsItsForm: finance proposes how a flagged refund ended and is
// refused (the evidence was blank): the payment's page comes back with the form open and what
// was typed in it, and a change to the payment while it is open does not refresh the page over
// it (the server marked it data-live-keep; live.js holds the refresh and says the page is
// behind).
func TestBrowserRefusedProposalKeepsItsForm(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	s := b.completed(t, "o-live-settle", 2000)
	b.flaggedRefund(t, s, 1500)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "fin@example.com")
	openLive(t, ctx, srv.URL+"/payments/"+s.ID)

	const reason = "the gateway's support says it never ran"
	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="refund-settle"] summary`)),
		liveClick(chromedp.CSS(`[data-testid="refund-settle-failed"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="refund-settle-reason"]`), reason),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="refund-settle-evidence"]`), " "),
		liveClick(chromedp.CSS(`[data-testid="refund-settle-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="flash-error"]`)),
	)
	waitJS(t, ctx, "the page's live stream to open", `document.documentElement.getAttribute("data-live-state") === "live"`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.pitlaneMarker = "no reload"`)); err != nil {
		t.Fatal(err)
	}
	kept := `(() => { const d = document.querySelector('[data-testid="refund-settle"]');
		return d.open && d.querySelector('[data-testid="refund-settle-reason"]').value === "` + reason + `" &&
			d.querySelector('[data-testid="refund-settle-failed"]').checked; })()`
	waitJS(t, ctx, "the form open with what was typed", kept)

	// The payment changes meanwhile: the page is told, and stays as it is, behind.
	if _, err := b.svc.CreateRefund(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.RefundInput{PaymentID: s.ID, Amount: 100}); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the live refresh held", `document.documentElement.hasAttribute("data-live-stale")`)
	waitJS(t, ctx, "the form still open with what was typed", kept)
	noReload(t, ctx)
}

// TestBrowserStuckPageShowsAPaymentTurningStuck: finance has "Stuck money" open with nothing
// stuck; a payment turns stuck by its age alone, with nothing written, so the page's stream
// stays silent. The region said when it would change (data-live-due): the page fetches itself
// then and lists the payment, with no reload. What broke (an outside review): the open
// workbench kept saying "Nothing is stuck" until some unrelated write. Negative control:
// without live.js's due() the wait for the payment times out.
func TestBrowserStuckPageShowsAPaymentTurningStuck(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	all, err := b.hub.Subscribe(live.Topic{Page: live.PagePayments}, b.hub.Position().String())
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	b.payment(t, "o-browser-stuck", 4200)
	// Everything the payment notified is heard before the page is read: its stream has nothing
	// to catch up on, so only the due refresh can bring the payment in.
	heardUpTo(t, all, b.payment(t, "o-browser-stuck-marker", 100).ID)
	b.clock.Advance(payments.SettleWithin - 2*time.Second) // the page is due in 2 s
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "fin@example.com")
	openLive(t, ctx, srv.URL+"/finance/stuck")
	waitJS(t, ctx, "nothing stuck yet", `!!document.querySelector('[data-testid="stuck-none"]')`)

	b.clock.Advance(time.Minute)
	waitJS(t, ctx, "the payment on the list", `(() => { const e = document.querySelector('[data-testid="stuck-table"]'); return !!e && e.textContent.includes("42.00"); })()`)
	noReload(t, ctx)
}

// focused says what has the keyboard focus: its tag and data-testid.
func focused(t *testing.T, ctx context.Context) string {
	t.Helper()
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const e = document.activeElement; return e.tagName + " " + (e.getAttribute("data-testid") || ""); })()`))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// tabUntil presses Tab until the expression (about document.activeElement) is true.
func tabUntil(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	for i := 0; i < 60; i++ {
		within(t, ctx, 5*time.Second, chromedp.KeyEvent("\t"))
		on, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err != nil {
			t.Fatal(err)
		}
		if on {
			return
		}
	}
	t.Fatalf("Tab never reached %s", what)
}

// TestBrowserLiveRefreshKeepsKeyboardFocus: support, working by keyboard, has tabbed to "Check
// with the gateway" on a payment's page when the customer pays: the live region is swapped in
// place (outerHTML), and the focus fell to the document's body with the old button (a screen
// reader lost its place, the next Tab started at the top of the page; an outside review). It
// stays on the new Check button now (live.js refocus). Negative control: without the refocus
// call in live.js's htmx:afterSwap listener the focus is on "BODY ".
func TestBrowserLiveRefreshKeepsKeyboardFocus(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, "o-live-focus", 1999)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/payments/"+s.ID)
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Registered")
	tabUntil(t, ctx, "the Check button", `document.activeElement.getAttribute("data-testid") === "check"`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { window.oldCheck = document.activeElement; return true; })()`)); err != nil {
		t.Fatal(err)
	}

	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, `[data-testid="payment-status"]`, "Completed")
	noReload(t, ctx)
	swapped, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!document.contains(window.oldCheck)`))
	if err != nil || !swapped {
		t.Fatalf("the Check button was not swapped (%v): the test shows nothing", err)
	}
	if got := focused(t, ctx); got != "BUTTON check" {
		t.Fatalf("after the live refresh the keyboard focus is on %q, want the Check button it was on", got)
	}
}

// TestBrowserLocksPageKeepsKeyboardFocus: the locks page fetches itself every 10 s while it is
// visible, whether anything changed or not. A keyboard user who tabbed to a leased payment's
// link had the focus thrown to the page's body at every tick (an outside review). The link keeps
// it now. Negative control: as TestBrowserLiveRefreshKeepsKeyboardFocus's.
func TestBrowserLocksPageKeepsKeyboardFocus(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, "o-live-lease-focus", 1000)
	b.exec(t, `UPDATE payment_sessions SET lease_owner = 'replica-a', lease_until = $2, lease_token = gen_random_uuid() WHERE id = $1`,
		s.ID, b.clock.Now().Add(time.Hour))
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/locks")
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		window.swaps = 0; document.addEventListener("htmx:afterSwap", () => { window.swaps++; }); return true; })()`)); err != nil {
		t.Fatal(err)
	}
	tabUntil(t, ctx, "the lease's link", `(document.activeElement.getAttribute("href") || "").includes("`+s.ID+`")`)
	waitJS(t, ctx, "the page's 10-second refresh", `window.swaps >= 1`)
	noReload(t, ctx)
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const e = document.activeElement; return e.tagName + " " + (e.getAttribute("href") || ""); })()`))
	if err != nil {
		t.Fatal(err)
	}
	if got != "A /payments/"+s.ID {
		t.Fatalf("after the locks page's timed refresh (nothing changed) the keyboard focus is on %q, want the link it was on", got)
	}
}

// TestBrowserLivePagesCanBePaused: WCAG 2.2.2 Pause, Stop, Hide. The console's live pages update
// themselves (the locks page also every 10 s), and a staff member reading a table with a screen
// reader or a magnifier could not stop that, as the checkout's "Stop updating this page" allows
// (an outside review). Every live page has a "Pause updates" toggle (aria-pressed), reached by
// Tab; while pressed the list does not change (the page says it is behind, data-live-stale), and
// released it catches up at once. Negative control: without the paused checks in live.js
// (refresh and its beforeSwap listener) the refresh is swapped in and the page is never behind.
func TestBrowserLivePagesCanBePaused(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	s := b.payment(t, "o-live-pause-old", 1999)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "fin@example.com")
	pause := `document.querySelector('[data-testid="live-pause"]')`
	for _, path := range []string{"/", "/payments/" + s.ID, "/locks", "/finance/stuck", "/finance/cases", "/finance/flagged", "/finance/resolutions", "/finance/ledger", "/payments"} {
		openLive(t, ctx, srv.URL+path)
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const p = `+pause+`;
			return p ? p.tagName + " " + p.textContent + " " + p.getAttribute("aria-pressed") : "none"; })()`))
		if err != nil || got != "BUTTON Pause updates false" {
			t.Fatalf("%s: the pause control is %q (%v), want a button \"Pause updates\", aria-pressed false", path, got, err)
		}
	}
	// The payments list, paused by keyboard.
	tabUntil(t, ctx, "Pause updates", `document.activeElement.getAttribute("data-testid") === "live-pause"`)
	within(t, ctx, 5*time.Second, chromedp.KeyEvent(" "))
	waitJS(t, ctx, "the button pressed", pause+`.getAttribute("aria-pressed") === "true"`)
	b.clock.Advance(time.Minute)
	n := b.payment(t, "o-live-pause-new", 4200)
	row := `document.querySelector('[data-testid="payment-row"][data-id="` + n.ID + `"]')`
	waitJS(t, ctx, "the paused page to be behind", `document.documentElement.hasAttribute("data-live-stale")`)
	if shown, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!`+row)); err != nil || shown {
		t.Fatalf("the paused list shows the new payment (%v)", err)
	}
	within(t, ctx, 5*time.Second, chromedp.KeyEvent(" "))
	waitJS(t, ctx, "the new payment once resumed", `!!`+row+` && `+pause+`.getAttribute("aria-pressed") === "false"`)
	noReload(t, ctx)
}
