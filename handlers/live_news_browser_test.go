package handlers_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/views"
)

// liveNews is the text of the page's status line for live changes.
const liveNews = `document.querySelector('[data-testid="live-news"]').textContent`

// countLiveSwaps counts, from now on, the live refreshes swapped into the page (window.liveSwaps).
func countLiveSwaps(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		window.liveSwaps = 0;
		document.addEventListener("htmx:afterSwap", e => { if ((e.detail.requestConfig.headers || {})["X-Pitlane-Live"] === "1") window.liveSwaps++; });
		return true; })()`)); err != nil {
		t.Fatal(err)
	}
}

func newsNow(t *testing.T, ctx context.Context) string {
	t.Helper()
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](liveNews))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestBrowserLiveChangesAreAnnounced: WCAG 4.1.3 Status Messages. A live page's table changed in
// place and a screen reader said nothing: a payment completing, a new one arriving went unheard
// (an outside review). Each live page has one polite status line, in the page (empty, out of
// sight) from its load and outside the region a refresh swaps; a refresh that changed rows says
// how many, naming the row when it is one, and a figure by its name (the payment's Status). A
// refresh that changed nothing says nothing, and a paused page says nothing until it is resumed.
// The table itself is no live region. Negative control: live.js without the say(news(…)) call
// in its htmx:afterSwap listener times out waiting for "1 row changed".
func TestBrowserLiveChangesAreAnnounced(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	bg := context.Background()
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	p1 := b.payment(t, "o-news-1", 1999)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/payments?q=o-news")

	line, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
		const n = document.querySelectorAll('[data-testid="live-news"]'), e = n[0], r = document.getElementById("payments-live");
		if (n.length !== 1) return n.length + " status lines";
		return [e.getAttribute("role"), e.getAttribute("aria-live"), e.getBoundingClientRect().width <= 1 ? "hidden" : "in sight",
			r.contains(e) ? "inside the region" : "outside", document.querySelectorAll("[aria-live]").length + " live", JSON.stringify(e.textContent)].join(" ");
	})()`))
	if want := `status polite hidden outside 1 live ""`; err != nil || line != want {
		t.Fatalf("the page's status line: %q (%v), want %q", line, err, want)
	}
	countLiveSwaps(t, ctx)

	// Another order's payment: the stream says refresh, the list (o-news…) stays the same.
	b.payment(t, "o-other", 500)
	waitJS(t, ctx, "the refresh for another order", `window.liveSwaps >= 1`)
	if got := newsNow(t, ctx); got != "" {
		t.Fatalf("a refresh that changed no row says %q", got)
	}

	// The customer pays: one row changes, and is named.
	b.gw.SetStatus(p1.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(bg, shop, p1.ID); err != nil {
		t.Fatal(err)
	}
	changed := "1 row changed: Payment " + views.Short(p1.ID)
	waitJS(t, ctx, "the status line to say "+changed, liveNews+` === "`+changed+`"`)

	// Paused, two new payments are not shown, nor told; resumed, they are, together.
	pause := `document.querySelector('[data-testid="live-pause"]')`
	within(t, ctx, 5*time.Second, chromedp.Click(chromedp.CSS(`[data-testid="live-pause"]`)))
	waitJS(t, ctx, "the page paused", pause+`.getAttribute("aria-pressed") === "true"`)
	b.clock.Advance(time.Minute)
	b.payment(t, "o-news-2", 300)
	b.payment(t, "o-news-3", 400)
	waitJS(t, ctx, "the paused page to be behind", `document.documentElement.hasAttribute("data-live-stale")`)
	if got := newsNow(t, ctx); got != changed {
		t.Fatalf("while paused the status line says %q, want what it said before (%q)", got, changed)
	}
	within(t, ctx, 5*time.Second, chromedp.Click(chromedp.CSS(`[data-testid="live-pause"]`)))
	waitJS(t, ctx, "the status line to say 2 rows added", liveNews+` === "2 rows added"`)

	// The payment's page names its status when it changes (its timeline gains rows too).
	p4 := b.payment(t, "o-news-4", 700)
	openLive(t, ctx, srv.URL+"/payments/"+p4.ID)
	// Every line said, kept: the Check's gateway call and its new status may come in one refresh
	// ("Status: Completed; 2 rows added") or two ("1 row added", then "Status: Completed; 1 row
	// added" or, the rows already shown, "Status: Completed"), as the notifications land (a CI
	// run read the last line alone).
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		const el = document.querySelector('[data-testid="live-news"]');
		window.newsSaid = [];
		new MutationObserver(() => { if (el.textContent) window.newsSaid.push(el.textContent); }).observe(el, {childList: true, characterData: true, subtree: true});
		return true; })()`)); err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(p4.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(bg, shop, p4.ID); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the status line to name the status", liveNews+`.startsWith("Status: Completed")`)
	said, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.newsSaid`))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(said, func(s string) bool { return strings.Contains(s, "added") }) {
		t.Fatalf("the payment page's status lines were %q, want the status named and the rows added announced", said)
	}
	noReload(t, ctx)
}

// TestBrowserLiveNewsIgnoresTheClock: the locks page fetches itself every 10 s; a lease's "(in
// 1h)" becomes "(in 59m)" by the clock alone. That is no news: the status line stays empty
// (the relative times are data-live-quiet). Negative control: the lease's relative time without
// data-live-quiet (views/locks.templ) says "1 row changed: Payment …" at the tick.
func TestBrowserLiveNewsIgnoresTheClock(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, "o-news-lease", 1000)
	b.exec(t, `UPDATE payment_sessions SET lease_owner = 'replica-a', lease_until = $2, lease_token = gen_random_uuid() WHERE id = $1`,
		s.ID, b.clock.Now().Add(time.Hour))
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/locks")
	countLiveSwaps(t, ctx)
	until := `document.querySelector('[data-testid="lease-until"]').textContent.replace(/\s+/g, " ").trim()`
	before, err := chromedp.Run(ctx, chromedp.Evaluate[string](until))
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	waitJS(t, ctx, "the page's 10-second refresh, the lease's time moved on", `window.liveSwaps >= 1 && `+until+` !== "`+before+`"`)
	if got := newsNow(t, ctx); got != "" {
		t.Fatalf("a refresh where only the clock moved says %q", got)
	}
}
