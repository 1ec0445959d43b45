package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Real Chromium for what only a browser shows: a double click on Pay, and htmx swapping the
// dashboard's live part. The browser is found at CHROMIUM_BIN (make test sets it) or
// /usr/bin/chromium; without one these tests FAIL, they never skip.

func newBrowser(t *testing.T) context.Context {
	t.Helper()
	bin := os.Getenv("CHROMIUM_BIN")
	if bin == "" {
		bin = "/usr/bin/chromium"
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Fatalf("this test needs Chromium at %s (CHROMIUM_BIN): run `make test`, or `apt-get install -y chromium`", bin)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		cancelAlloc()
		if a, ok := chromedp.FromContext(ctx).Allocator.(*chromedp.ExecAllocator); ok {
			a.Wait()
		}
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser, bound to ctx
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx
}

// watchCSP collects what the browser says about the Content-Security-Policy from now on (the
// server sends "self only": an inline script or style, or htmx injecting one, is refused and
// reported on the console). The returned func gives what was collected so far.
func watchCSP(t *testing.T, ctx context.Context) func() []string {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	messages := chromedp.Console(cctx)
	var mu sync.Mutex
	var got []string
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if strings.Contains(m.Text, "Content Security Policy") || strings.Contains(m.Text, "Content-Security-Policy") {
				mu.Lock()
				got = append(got, m.String())
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// within runs browser actions with a deadline (the browser itself lives on).
func within(t *testing.T, ctx context.Context, d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(tctx, steps...); err != nil {
		// Bounded too: a browser that did not finish the steps may not answer these either, and
		// unbounded they held the package until its timeout (15 minutes) with nothing said.
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		loc, _ := chromedp.Run(dctx, chromedp.Location())
		html, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("browser: %v (at %s)\n%s", err, loc, html)
	}
}

// liveClick is chromedp.Click made safe against a live region's swap. A page's live region is
// re-rendered when its stream says so, and right after an action it usually says so once for
// the action's own change (the hub hears the commit's notification after the page took its
// position: a redundant refresh, never a missed one). A swap between chromedp's query of the
// node and its click fails the click with "Could not find node" before any mouse event is sent,
// so querying again and clicking is safe; it is tried up to three times.
func liveClick[S chromedp.Selectable](sel S) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		for attempt := 1; ; attempt++ {
			_, err := chromedp.Click(sel)(ctx, tg)
			if err == nil || attempt == 3 || !strings.Contains(err.Error(), "Could not find node") {
				return err
			}
		}
	})
}

// handClick returns a click on the button with the data-testid as a hand makes one: press and
// release at the button's place, with the click count given, so a double click is click(1) and,
// a moment later when the first request is on its way, click(2). (Two clicks within the same
// instant are merged by the browser before any request leaves: that case needs no server.)
func handClick(t *testing.T, ctx context.Context, testid string) func(n int) {
	t.Helper()
	xy, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(() => {
		const b = document.querySelector('[data-testid="`+testid+`"]');
		b.scrollIntoView({block: "center"});
		const r = b.getBoundingClientRect();
		return [r.x + r.width / 2, r.y + r.height / 2];
	})()`))
	if err != nil || len(xy) != 2 {
		t.Fatalf("position of %s: %v %v", testid, xy, err)
	}
	return func(n int) {
		t.Helper()
		within(t, ctx, 10*time.Second,
			chromedp.MouseEvent(chromedp.MousePressed, xy[0], xy[1], chromedp.ButtonLeft, chromedp.ClickCount(n)),
			chromedp.MouseEvent(chromedp.MouseReleased, xy[0], xy[1], chromedp.ButtonLeft, chromedp.ClickCount(n)),
		)
	}
}

// pageGateway is the fake gateway with payment pages a browser can open.
type pageGateway struct {
	*fakegw.Gateway
	base string
}

func (g pageGateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	gp, err := g.Gateway.Register(ctx, req)
	if err == nil {
		gp.ConfirmationURL = g.base + "/pay/" + gp.ID
	}
	return gp, err
}

// posts counts the POSTs under prefix that arrive and reports each one's status when it is done.
type posts struct {
	h       http.Handler
	prefix  string
	arrived atomic.Int32
	done    chan int
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }

// Unwrap lets http.ResponseController reach the connection (flushes and deadlines of streams).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (p *posts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, p.prefix) {
		p.h.ServeHTTP(w, r)
		return
	}
	p.arrived.Add(1)
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	p.h.ServeHTTP(sw, r)
	p.done <- sw.status
}

// TestBrowserDoubleClickPay: the customer double-clicks Pay while the first request is still
// registering at the gateway. The browser sends both POSTs (and drops the first); the second
// finds the click in flight and waits on the order's page; the first finishes anyway. The
// customer ends on the gateway's page of the one payment: one session, one registration.
func TestBrowserDoubleClickPay(t *testing.T) {
	b := newConsoleBench(t)
	gwPages := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><title>gateway</title><h1 id="gateway-page">Payment page %s</h1>`, strings.TrimPrefix(r.URL.Path, "/pay/"))
	}))
	defer gwPages.Close()
	// The pages are served over plain http: trusted as the configured gateway's own origin.
	_, e := b.replica(b.pool, "replica-browser", pageGateway{Gateway: b.gw, base: gwPages.URL},
		func(c *payments.Config) { c.GatewayURL = gwPages.URL })
	counter := &posts{h: e, prefix: "/checkout/", done: make(chan int, 10)}
	srv := b.server(t, counter)

	ctx := newBrowser(t)
	csp := watchCSP(t, ctx)
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+b.link(t, "o-double", 1999, "EUR")), // the shop's signed link
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="checkout-pay"]`)),
	)
	click := handClick(t, ctx, "checkout-pay")

	gate := b.gw.Hold(fakegw.OpRegister)
	defer gate.Open()
	click(1)
	mustWaitC(t, gate.Arrived(), "the first Pay request at the gateway")
	click(2)
	// The first request is held at the gateway, so the request that completes is the second.
	if st := mustWaitC(t, counter.done, "the second Pay request"); st != http.StatusSeeOther {
		t.Fatalf("second Pay request answered %d", st)
	}
	gate.Open()
	within(t, ctx, 30*time.Second, chromedp.WaitVisible(chromedp.CSS(`#gateway-page`)))

	if n := counter.arrived.Load(); n != 2 {
		t.Fatalf("%d Pay POSTs reached the server, want 2 (the double click)", n)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("%d registrations at the gateway, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-double'`); n != 1 {
		t.Fatalf("%d sessions, want 1", n)
	}
	var gpID string
	if err := b.pool.QueryRow(context.Background(), `SELECT gateway_payment_id FROM payment_sessions WHERE order_id = 'o-double'`).Scan(&gpID); err != nil {
		t.Fatal(err)
	}
	if loc, _ := chromedp.Run(ctx, chromedp.Location()); loc != gwPages.URL+"/pay/"+gpID {
		t.Fatalf("browser at %s, want the payment page of %s", loc, gpID)
	}
	// The first request finished too (on its own context, though the browser dropped it).
	mustWaitC(t, counter.done, "the first Pay request")
	if v := csp(); len(v) > 0 {
		t.Fatalf("the browser refused content under the Content-Security-Policy:\n%s", strings.Join(v, "\n"))
	}
}

// TestBrowserDashboardLiveUpdate: a payment completes while staff look at the dashboard; the
// counts change in place (the live stream says refresh, htmx swaps the fragment), without a page
// load.
func TestBrowserDashboardLiveUpdate(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, "o-live", 1999)
	srv := b.server(t, b.e)

	ctx := newBrowser(t)
	csp := watchCSP(t, ctx)
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="login-form"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="login-email"]`), "sup@example.com"),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="login-password"]`), testPassword),
		liveClick(chromedp.CSS(`[data-testid="login-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="dashboard-live"]`)),
	)
	before, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.pitlaneMarker = "no reload";
		document.querySelector('[data-testid="count-Completed"]').textContent.trim()`))
	if err != nil || before != "0" {
		t.Fatalf("Completed before: %q %v", before, err)
	}

	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(tctx, chromedp.Poll[bool](`document.querySelector('[data-testid="count-Completed"]').textContent.trim() === "1"
		&& document.querySelector('[data-testid="count-Registered"]').textContent.trim() === "0"`,
		chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("the dashboard never showed the completed payment: %v", err)
	}
	marker, err := chromedp.Run(ctx, chromedp.Evaluate[string](`String(window.pitlaneMarker)`))
	if err != nil || marker != "no reload" {
		t.Fatalf("the page was reloaded instead of swapped (marker %q, %v)", marker, err)
	}
	// The sign-in page, the dashboard, its stream and its refreshes ran under the policy without a
	// refusal.
	if v := csp(); len(v) > 0 {
		t.Fatalf("the browser refused content under the Content-Security-Policy:\n%s", strings.Join(v, "\n"))
	}
}

func mustWaitC[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}
