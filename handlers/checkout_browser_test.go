package handlers_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/views"
)

// The customer's checkout in real Chromium: the decline → try again → paid story with
// JavaScript off, and every state of the page checked by axe-core (WCAG 2.x A and AA rules and
// axe's best practices: labels, contrast, landmarks, lang, headings) at a 360 px phone's width
// and at a desktop's, with no sideways scrolling on the phone, a visible focus ring in DOM order,
// and a screenshot of each under .pitlane/screenshots/ (kept as test artifacts).

// axeTags are the axe-core rule sets every checkout page must pass without a violation.
var axeTags = []string{"wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"}

// viewport is a browser window the checkout must work in.
type viewport struct {
	name          string
	width, height int64
	mobile        bool
}

var checkoutViewports = []viewport{{"phone", 360, 740, true}, {"desktop", 1280, 900, false}}

// repoRoot is the module's root directory (where go.mod is): test assets and artifacts live
// there, whichever package's directory the test runs in.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

var (
	axeOnce sync.Once
	axeJS   string
	axeErr  error
)

// axeSource is axe-core's axe.min.js, a test-only asset from the npm registry that `make test`
// installs (AXE_JS names it; default .bin/axe/… under the repository). Without it the test
// FAILS with the way to get it; it never skips.
func axeSource(t *testing.T) string {
	t.Helper()
	path := os.Getenv("AXE_JS")
	if path == "" {
		path = filepath.Join(repoRoot(t), ".bin", "axe", "node_modules", "axe-core", "axe.min.js")
	}
	axeOnce.Do(func() {
		b, err := os.ReadFile(path)
		axeJS, axeErr = string(b), err
	})
	if axeErr != nil {
		t.Fatalf("this test needs axe-core (AXE_JS): run `make test`, or `npm install --prefix .bin/axe axe-core@4`: %v", axeErr)
	}
	return axeJS
}

// axeViolation is one failed rule, as axe-core reports it.
type axeViolation struct {
	ID     string   `json:"id"`
	Impact string   `json:"impact"`
	Help   string   `json:"help"`
	Nodes  []string `json:"nodes"`
}

// checkA11y runs axe-core on the page in the browser and fails on any violation. axe is
// evaluated through DevTools, as an extension would: the page itself allows no script but its
// own files (Content-Security-Policy), and the checkout has none.
func checkA11y(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	tags := `["` + strings.Join(axeTags, `","`) + `"]`
	violations, err := chromedp.Run(ctx, chromedp.Evaluate[[]axeViolation](`(async () => {
		const r = await axe.run(document, {runOnly: {type: "tag", values: `+tags+`}, resultTypes: ["violations"]});
		return r.violations.map(v => ({id: v.id, impact: v.impact || "", help: v.help,
			nodes: v.nodes.map(n => n.target.join(" ") + ": " + n.failureSummary)}));
	})()`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("%s: axe: %v", what, err)
	}
	for _, v := range violations {
		t.Errorf("%s: axe %s (%s): %s\n\t%s", what, v.ID, v.Impact, v.Help, strings.Join(v.Nodes, "\n\t"))
	}
}

// injectAxe loads axe-core into the current document (once per document).
func injectAxe(t *testing.T, ctx context.Context) {
	t.Helper()
	src := axeSource(t)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`typeof axe === "undefined" && (() => {`+src+`
	})()`)); err != nil {
		t.Fatalf("inject axe-core: %v", err)
	}
}

// setViewport makes the tab a phone (mobile: the page's viewport meta counts) or a desktop window.
func setViewport(t *testing.T, ctx context.Context, vp viewport) {
	t.Helper()
	opts := []chromedp.EmulateViewportOption{}
	if vp.mobile {
		opts = append(opts, chromedp.EmulateMobile, chromedp.EmulatePortrait)
	}
	within(t, ctx, 10*time.Second, chromedp.EmulateViewport(vp.width, vp.height, opts...))
}

// scripts turns JavaScript in the tab off (the checkout must work with forms, links and the
// Refresh header alone) or back on. axe-core needs it on for its run (its promise waits on
// timers): a page already loaded runs none of its own meanwhile, and checkout pages have none.
func scripts(t *testing.T, ctx context.Context, on bool) {
	t.Helper()
	within(t, ctx, 10*time.Second, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: !on})
		return err
	}))
}

// checkPage is everything the checkout promises about the page the tab shows now, in the
// tab's viewport: axe finds nothing, nothing scrolls sideways, the keyboard reaches every
// control in DOM order with a visible focus ring; then its screenshot.
func checkPage(t *testing.T, ctx context.Context, vp viewport, name string) {
	t.Helper()
	what := name + " at " + vp.name
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.scripts.length`)); err != nil || n != 0 {
		t.Fatalf("%s: %d scripts on a checkout page (%v)", what, n, err)
	}
	scripts(t, ctx, true)
	injectAxe(t, ctx)
	checkA11y(t, ctx, what)
	scripts(t, ctx, false)
	over, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`))
	if err != nil || len(over) != 2 {
		t.Fatalf("%s: widths %v %v", what, over, err)
	}
	if over[0] > over[1] {
		t.Errorf("%s: the page is %d px wide in a %d px window (sideways scrolling)", what, over[0], over[1])
	}
	checkFocusOrder(t, ctx, what)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`document.activeElement && document.activeElement.blur()`)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "checkout-"+name+"-"+vp.name+".png") // console_finance_browser_test.go
}

// checkFocusOrder tabs through the page from the top: the keyboard must reach every link and
// button, in the order they are read, each with a visible focus ring.
func checkFocusOrder(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	want, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
		document.activeElement && document.activeElement.blur();
		window.getSelection().removeAllRanges();
		return [...document.querySelectorAll('a[href], button, input:not([type=hidden]), select, textarea')]
			.map(e => e.outerHTML.slice(0, 80));
	})()`))
	if err != nil {
		t.Fatalf("%s: focusables: %v", what, err)
	}
	var got []string
	for range want {
		within(t, ctx, 5*time.Second, chromedp.KeyEvent("\t"))
		f, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
			const e = document.activeElement, s = getComputedStyle(e);
			return [e.outerHTML.slice(0, 80), s.outlineStyle, s.outlineWidth];
		})()`))
		if err != nil {
			t.Fatalf("%s: focused element: %v", what, err)
		}
		if f[1] == "none" || f[2] == "0px" {
			t.Errorf("%s: no visible focus ring on %s", what, f[0])
		}
		got = append(got, f[0])
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s: focus order\n%s\nwant the reading order\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// storyGateway is the fake gateway with a payment page where the customer decides: Approve
// (authorized; the test captures later) or Decline, then back to the shop's return URL.
type storyGateway struct {
	*fakegw.Gateway
	base    string
	mu      sync.Mutex
	returns map[string]string // gateway payment id → the return URL it was registered with
}

func (g *storyGateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	gp, err := g.Gateway.Register(ctx, req)
	if err == nil {
		gp.ConfirmationURL = g.base + "/pay/" + gp.ID
		g.mu.Lock()
		g.returns[gp.ID] = req.ReturnURL
		g.mu.Unlock()
	}
	return gp, err
}

func (g *storyGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if r.Method == http.MethodGet {
		fmt.Fprintf(w, `<!doctype html><html lang="en"><title>bank</title><h1 id="bank">Bank page %s</h1>
			<form method="post" action="/pay/%s/approve"><button id="approve">Approve</button></form>
			<form method="post" action="/pay/%s/decline"><button id="decline">Decline</button></form>`, id, id, id)
		return
	}
	st := payments.GatewayAuthorized
	if strings.HasSuffix(r.URL.Path, "/decline") {
		st = payments.GatewayDeclined
	}
	g.SetStatus(id, st)
	g.mu.Lock()
	back := g.returns[id]
	g.mu.Unlock()
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// TestBrowserCheckoutDeclineRetryPaid: the customer's whole story with JavaScript off. Pay →
// the bank's page → Decline → back on the order's page: declined, "Try again" → a new payment
// (a new intent: a second registration) → Approve → back: processing, the page looks again by
// itself → the bank captures → Paid, without a click. One ledger entry, one Completed session;
// every page on the way passes axe and is kept as a screenshot.
func TestBrowserCheckoutDeclineRetryPaid(t *testing.T) {
	b := newConsoleBench(t)
	var e http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { e.ServeHTTP(w, r) }))
	defer srv.Close()
	bank := &storyGateway{Gateway: b.gw, returns: map[string]string{}}
	bankSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux := http.NewServeMux()
		mux.Handle("/pay/{id}", bank)
		mux.Handle("POST /pay/{id}/approve", bank)
		mux.Handle("POST /pay/{id}/decline", bank)
		mux.ServeHTTP(w, r)
	}))
	defer bankSrv.Close()
	bank.base = bankSrv.URL
	_, e = b.replica(b.pool, "replica-story", bank, func(c *payments.Config) {
		c.GatewayURL = bankSrv.URL // its pages are plain http: trusted as the gateway's own origin
		c.ReturnURL = func(s payments.Session) string { return srv.URL + "/checkout/" + s.OrderID + "/return" }
	})

	ctx := newBrowser(t)
	csp := watchCSP(t, ctx)
	scripts(t, ctx, false)
	phone := checkoutViewports[0]
	setViewport(t, ctx, phone)
	state := func(s string) chromedp.Action[chromedp.Void] {
		return chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`[data-testid="checkout-state"][data-state=%q]`, s)))
	}

	within(t, ctx, 20*time.Second, chromedp.Navigate(srv.URL+b.link(t, "o-story", 2500, "EUR")), state(views.CheckoutPay))
	checkPage(t, ctx, phone, "story-1-pay")
	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="checkout-pay"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#bank`)),
		liveClick(chromedp.CSS(`#decline`)),
		state(views.CheckoutDeclined),
	)
	checkPage(t, ctx, phone, "story-2-declined")

	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="checkout-retry"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#bank`)),
		liveClick(chromedp.CSS(`#approve`)),
		state(views.CheckoutConfirming),
	)
	// The waiting page reloads itself a second after it arrives, which would pull the page from
	// under the checks; they look at it a few looks in (its Refresh 30 s away), and the story
	// goes on from the page as the customer had it.
	processing, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	within(t, ctx, 20*time.Second, chromedp.Navigate(withLook(t, processing, "5")), state(views.CheckoutConfirming))
	checkPage(t, ctx, phone, "story-3-processing")
	within(t, ctx, 20*time.Second, chromedp.Navigate(withLook(t, processing, "")), state(views.CheckoutConfirming))

	// The bank captures; pages ask it at most every 5 s (the test's clock), and the waiting page
	// looks again by itself (Refresh): Paid arrives without a click.
	var second string
	if err := b.pool.QueryRow(context.Background(), `SELECT gateway_payment_id FROM payment_sessions
		WHERE order_id = 'o-story' AND status = 'Authorized'`).Scan(&second); err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(second, payments.GatewaySucceeded)
	b.clock.Advance(payments.PageLookEvery)
	within(t, ctx, 60*time.Second, state(views.CheckoutPaid))
	checkPage(t, ctx, phone, "story-4-paid")

	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Errorf("%d registrations at the gateway, want 2 (the declined payment and the retry)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM checkout_intents WHERE order_id = 'o-story' AND session_id IS NOT NULL`); n != 2 {
		t.Errorf("%d intents bound to sessions, want 2: Try again is a new intent", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-story' AND status = 'Failed'`); n != 1 {
		t.Errorf("%d failed sessions, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-story'`); n != 1 {
		t.Errorf("%d ledger entries, want 1", n)
	}
	if v := csp(); len(v) > 0 {
		t.Fatalf("the browser refused content under the Content-Security-Policy:\n%s", strings.Join(v, "\n"))
	}
}

// withLook is a waiting page's URL with its look count set (none when n is empty).
func withLook(t *testing.T, raw, n string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if q.Del("look"); n != "" {
		q.Set("look", n)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// TestBrowserCheckoutStatesAccessible: every state of the checkout, and its error pages (404,
// the 403 of a Pay click whose CSRF cookie is gone, the 503 of a database outage), at a 360 px
// phone's width and at a desktop's: axe-core finds no violation, nothing scrolls sideways, the
// focus order is the reading order with a visible ring; a screenshot of each is kept. Waiting
// pages are opened a few looks in (their Refresh is 30 s away, not 1 s), so the page does not
// reload under the checks.
func TestBrowserCheckoutStatesAccessible(t *testing.T) {
	b := newConsoleBench(t)
	cases := b.checkoutStates(t)
	srv := httptest.NewServer(b.e)
	defer srv.Close()
	foreign := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>A shop</title><form method="post" action="%s"><button data-testid="foreign-pay">Pay</button></form>`,
			html.EscapeString(srv.URL+cases[0].path))
	}))
	defer foreign.Close()
	ctx := newBrowser(t)
	csp := watchCSP(t, ctx)
	scripts(t, ctx, false)

	open := func(path, ready string) {
		t.Helper()
		within(t, ctx, 20*time.Second, chromedp.Navigate(srv.URL+path), chromedp.WaitVisible(chromedp.CSS(ready)))
	}
	for _, vp := range checkoutViewports {
		setViewport(t, ctx, vp)
		for _, tc := range cases {
			path := tc.path
			if tc.waits {
				path += "&look=5" // the order's page, with its page token
			}
			if tc.state == views.CheckoutContinue {
				// The way to the bank's page shows once the page heard the gateway: within 5 s of
				// the last look (the other viewport's) it waits for the gateway's word instead.
				b.clock.Advance(payments.PageLookEvery)
			}
			open(path, fmt.Sprintf(`[data-testid=%q]`, tc.testid))
			checkPage(t, ctx, vp, tc.state)
		}
		open("/checkout/bad%20id", `[data-testid="checkout-error"]`)
		checkPage(t, ctx, vp, "error-404")
		// The 403 a customer can meet: a Pay form posted from a page of another origin (a shop's
		// page copying the form) without this site's token. (A Pay from the checkout's own page
		// whose cookies went passes: the browser says it is same-origin, web/auth.)
		within(t, ctx, 20*time.Second,
			chromedp.Navigate(foreign.URL),
			liveClick(chromedp.CSS(`[data-testid="foreign-pay"]`)),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid="checkout-error"][data-status="403"]`)),
		)
		checkPage(t, ctx, vp, "error-403")
	}
	var db string
	if err := b.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	restore := outage(t, db)
	for _, vp := range checkoutViewports {
		setViewport(t, ctx, vp)
		// With its look count high (&look=5): the 503 page of a look reloads itself, after 1 s at
		// first, and a reload in the middle of the checks below hung the screenshot for the
		// package's whole timeout on a loaded machine.
		open(b.orderPage("o-pay", "")+"&look=5", `[data-testid="checkout-error"][data-status="503"]`)
		checkPage(t, ctx, vp, "error-503")
	}
	restore()
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-pay'`); n != 0 {
		t.Errorf("the refused Pay clicks created %d sessions", n)
	}
	if v := csp(); len(v) > 0 {
		t.Fatalf("the browser refused content under the Content-Security-Policy:\n%s", strings.Join(v, "\n"))
	}
}

// TestBrowserCheckoutURLsResolveAsTheTestsDo: the tests' browserURL (checkout_url_test.go)
// resolves checkout URLs as Chromium's own URL parser does (new URL(ref, base)): the literal and
// the percent-encoded dot segments go, "~." and "~.." (payments.CheckoutPath's spelling of the
// order ids "." and "..") stay. The dot-segment tests that use the helper stand for a browser.
func TestBrowserCheckoutURLsResolveAsTheTestsDo(t *testing.T) {
	const base = "https://shop.example/checkout/o-1?amount=1"
	refs := []string{
		"/checkout/.", "/checkout/..?amount=1", "/checkout/%2E?amount=1", "/checkout/%2e%2E?amount=1",
		"/checkout/.%2E/return?view=x", "/checkout/%2E./return", "%2E%2E/x", "./%2e/y",
		"/checkout/~.", "/checkout/~..?amount=1", "/checkout/~../return?view=x", "/checkout/a..", "/checkout/.a",
		payments.CheckoutPath(".") + "?amount=1", payments.CheckoutPath("..") + "/return?view=x",
		"https://shop.example/checkout/~..?view=x", "https://shop.example/checkout/%2E%2E?view=x",
	}
	ctx := newBrowser(t)
	within(t, ctx, 20*time.Second, chromedp.Navigate("about:blank"))
	js := "[" + strings.Join(func() []string {
		q := make([]string, len(refs))
		for i, r := range refs {
			q[i] = fmt.Sprintf("%q", r)
		}
		return q
	}(), ",") + fmt.Sprintf("].map(r => new URL(r, %q).href)", base)
	got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](js))
	if err != nil || len(got) != len(refs) {
		t.Fatalf("Chromium's URLs: %v %v", got, err)
	}
	for i, ref := range refs {
		if want := browserURL(t, base, ref).String(); got[i] != want {
			t.Errorf("%s: Chromium resolves it to %s, the tests' browserURL to %s", ref, got[i], want)
		}
	}
}
