package handlers_test

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
)

// TestBrowserSkipLinkLeadsToMain: WCAG 2.4.1 Bypass Blocks. A keyboard user Tabbed through the
// brand, up to eight navigation links, the account link and Sign out before reaching anything of
// the page itself, on every console page. The first Tab from a page's load now reaches "Skip to
// main content", out of sight until then and in sight once focused; Enter gives the focus to the
// page's main, and the next Tab goes on inside it. On a live page, a finance page, the payment
// page and the error page; the sign-in page has the link too, though its load puts the focus in
// the email field already (autofocus). Negative control: the layout as it was (no link, main
// without an id) fails at once, "the skip link is missing".
func TestBrowserSkipLinkLeadsToMain(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	s := b.payment(t, "o-skip", 1999)
	srv := b.server(t, b.e)
	ctx := newBrowser(t)

	check := func(path, main string, autofocus bool) {
		t.Helper()
		within(t, ctx, 20*time.Second, chromedp.Navigate(srv.URL+path), chromedp.WaitVisible(chromedp.CSS(testid(main))))
		hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const l = document.querySelector('[data-testid="skip-link"]');
			return !!l && l.getBoundingClientRect().bottom <= 0; })()`))
		if err != nil || !hidden {
			t.Fatalf("%s: the skip link is missing or in sight before it has the focus (%v)", path, err)
		}
		if autofocus {
			// The sign-in page puts the focus in its email field: the user starts inside main.
			in, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("main").contains(document.activeElement)`))
			if err != nil || !in {
				t.Fatalf("%s: the page's load left the focus outside main (%v)", path, err)
			}
			return
		}
		within(t, ctx, 5*time.Second, chromedp.KeyEvent("\t"))
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const e = document.activeElement, r = e.getBoundingClientRect();
			return e.tagName + " " + (e.getAttribute("data-testid") || "") + " " + e.textContent.trim() + " " + e.getAttribute("href") +
				(r.top >= 0 && r.bottom <= innerHeight && r.width > 1 ? " in sight" : " out of sight"); })()`))
		if err != nil || got != "A skip-link Skip to main content #main in sight" {
			t.Fatalf("%s: the first Tab from the page's load is on %q (%v), want the skip link, in sight", path, got, err)
		}
		within(t, ctx, 5*time.Second, chromedp.KeyEvent("\r"))
		waitJS(t, ctx, path+"'s main to have the focus", `document.activeElement === document.getElementById("main") && document.activeElement.tagName === "MAIN"`)
		within(t, ctx, 5*time.Second, chromedp.KeyEvent("\t"))
		in, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const e = document.activeElement;
			return document.getElementById("main").contains(e) ? "" : e.tagName + " " + (e.getAttribute("data-testid") || ""); })()`))
		if err != nil || in != "" {
			t.Fatalf("%s: the Tab after the skip link is on %q outside main (%v)", path, in, err)
		}
	}
	check("/login", "login-form", true)
	browserLogin(t, ctx, srv.URL, "fin@example.com")
	check("/", "dashboard-live", false)
	check("/finance/cases", "cases-live", false)
	check("/payments/"+s.ID, "payment", false)
	check("/payments/00000000-0000-4000-8000-000000000000", "error", false)
}
