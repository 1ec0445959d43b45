package handlers_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments/gateway/fakegw"
)

// A customer opens the checkout link twice before any CSRF cookie exists (two tabs, a link
// opened again from the mail): each answer set a new cookie, the second replaced the first, and
// the first tab's Pay carried a token for a cookie the browser no longer had — a 403 "form
// expired" for a customer who did nothing wrong. A visitor's post that the browser says comes
// from this very origin (Sec-Fetch-Site: same-origin) is no forgery: it pays. One another site
// sent, or one from a browser that says nothing, still needs its token; signed-in staff always do.
func TestCheckoutTwoTabsOfAFirstVisitBothPay(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	link := b.link(t, "o-two-tabs", 1999, "EUR")

	// Two tabs' first loads, neither carrying a cookie; the browser keeps the second's.
	tab1, tab2 := b.agent(t), b.agent(t)
	action, form := payForm(t, tab1, link)
	payForm(t, tab2, link)
	tab1.jar = tab2.jar

	pay := func(site string) *http.Response {
		t.Helper()
		r := newFormRequest(action, form)
		if site != "" {
			r.Header.Set("Sec-Fetch-Site", site)
		}
		return tab1.do(r).Result()
	}
	for _, site := range []string{"", "cross-site", "same-site"} {
		if res := pay(site); res.StatusCode != http.StatusForbidden {
			t.Fatalf("the first tab's stale token, Sec-Fetch-Site %q: %d, want 403", site, res.StatusCode)
		}
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 0 {
		t.Fatalf("%d registrations before the same-origin Pay", n)
	}
	res := pay("same-origin")
	if loc := res.Header.Get("Location"); res.StatusCode != http.StatusSeeOther || loc == "" || strings.HasPrefix(loc, "/") {
		t.Fatalf("the first tab's Pay from this origin: %d %q, want 303 to the gateway's page", res.StatusCode, loc)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("%d registrations, want 1", n)
	}

	// Signed-in staff keep the strict per-session token, same origin or not.
	b.user(t, "ana@example.com", access.RoleSupport)
	s := b.payment(t, "o-two-tabs-staff", 1999)
	a := b.agent(t)
	a.login("ana@example.com")
	r := newFormRequest("/payments/"+s.ID+"/check", url.Values{"csrf_token": {"stale" + a.csrf}})
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	if rec := a.do(r); rec.Code != http.StatusForbidden {
		t.Fatalf("staff check with a stale token from this origin: %d, want 403", rec.Code)
	}
}
