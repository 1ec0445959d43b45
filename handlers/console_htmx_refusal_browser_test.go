package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/payments"
)

// Console forms review, session 32: a refusal before the handler runs (a wrong role: 403 EFORBIDDEN, as
// docs/console.md "Roles" says) is a page with the reason for a full-page post, but nothing at
// all for the same form posted by htmx (the payment page's action forms): htmx does not swap a
// 4xx/5xx answer and the console neither retargets it nor handles htmx:responseError. Here a
// support user moved to finance clicks "Check with the gateway" on the page they had open: the
// button did nothing, no message. static/app.js now shows a refused answer as a full-page post
// would (negative control: without its htmx:beforeSwap handler, no reason within 8 s).
func TestBrowserARefusedHtmxActionShowsWhy(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, "o-forms-htmx-403", 1500)
	var mu sync.Mutex
	var seen []string // the check posts the server answered, with their status and HX-Request
	srv := b.server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		b.e.ServeHTTP(rec, r)
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/check") {
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%d HX-Request=%s", rec.status, r.Header.Get("HX-Request")))
			mu.Unlock()
		}
	}))

	ctx := newBrowser(t)
	within(t, ctx, 10*time.Second, chromedp.EmulateViewport(1280, 900))
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+"/payments/"+s.ID),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="check"]`)),
	)
	// An admin moves the user to finance (no Check any more) while the page is open.
	if _, err := b.access.SetRole(context.Background(), payments.Staff{Email: "cli:test"}, "sup@example.com", access.RoleFinance); err != nil {
		t.Fatal(err)
	}
	// Control: the same post without htmx is the 403 page with the reason.
	plain := b.agent(t)
	plain.login("sup@example.com")
	page(t, plain.get("/payments/"+s.ID), http.StatusOK)
	if rec := plain.post("/payments/"+s.ID+"/check", nil); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "cannot open this page or do this") {
		t.Fatalf("full-page post after the role change: %d %s", rec.Code, rec.Body)
	}

	within(t, ctx, 10*time.Second, liveClick(chromedp.CSS(`[data-testid="check"]`)))
	shown, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.body.innerText.includes("cannot open this page or do this") || location.pathname !== "/payments/`+s.ID+`"`,
		chromedp.WithPollingTimeout(8*time.Second)))
	if err != nil || !shown {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the server answered the click %v; the browser shows no reason within 8 s (%v), still at %s:\n%.300s", seen, err, loc, body)
	}
}

// A refusal an htmx action got is said where the keyboard is: the button that had the focus went
// with the main app.js swapped out, the focus fell to the body, and the error page had no flash
// and no field to focus, nor a live region: a screen reader said nothing and the next Tab started
// at the top of the page (WCAG 4.1.3, 2.4.3; an outside review, a11y). The error page's section
// takes the focus.
func TestBrowserARefusedHtmxActionTakesTheFocus(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.payment(t, "o-forms-htmx-focus", 1500)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)
	within(t, ctx, 10*time.Second, chromedp.EmulateViewport(1280, 900))
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	openLive(t, ctx, srv.URL+"/payments/"+s.ID)
	if _, err := b.access.SetRole(context.Background(), payments.Staff{Email: "cli:test"}, "sup@example.com", access.RoleFinance); err != nil {
		t.Fatal(err)
	}
	tabUntil(t, ctx, "Check with the gateway", `document.activeElement.getAttribute("data-testid") === "check"`)
	within(t, ctx, 5*time.Second, chromedp.KeyEvent("\r"))
	waitJS(t, ctx, "the refusal", `document.body.innerText.includes("cannot open this page or do this")`)
	noReload(t, ctx)
	waitJS(t, ctx, "the focus on the refusal", `(() => {
		const err = document.querySelector('[data-testid="error"]');
		return !!err && err.contains(document.activeElement);
	})()`)
}
