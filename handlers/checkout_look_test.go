package handlers_test

import (
	"cmp"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/views"
)

// 120 loads of an order's checkout page and its return page, spread over two replicas, ask the
// gateway about the session once; the page answers what the database knows meanwhile. Five
// seconds later one load asks again and shows the news. The main before this change asked the
// gateway on every load (120 loads, 120 calls): anyone could spend the merchant's rate limit.
func TestCheckoutPagesAskTheGatewayAtMostEvery5s(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	_, other := b.replica(testdb.Pool(t, b.url), "replica-b", b.gw)
	s := b.payment(t, "o-looks", 1999)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	before := b.gw.Calls(fakegw.OpStatus)
	for i := range 120 {
		h := b.e
		if i%2 == 1 {
			h = other
		}
		path := b.orderPage("o-looks", "")
		if i%3 == 0 {
			path = b.orderPage("o-looks", "/return")
		}
		doc := page(t, newAgent(t, h).get(path), http.StatusOK)
		if i == 0 {
			wantText(t, doc, "checkout-status", "Authorized") // the first load asked
			b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
		} else if got := text(doc, "checkout-status"); got != "Authorized" {
			t.Fatalf("load %d shows %q: the gateway was asked again within 5 s", i, got)
		}
	}
	if n := b.gw.Calls(fakegw.OpStatus) - before; n != 1 {
		t.Fatalf("120 page loads made %d gateway calls, want 1", n)
	}
	b.clock.Advance(payments.PageLookEvery)
	doc := page(t, newAgent(t, other).get(b.orderPage("o-looks", "/return")), http.StatusOK)
	wantText(t, doc, "checkout-paid", "Paid")
	if n := b.gw.Calls(fakegw.OpStatus) - before; n != 2 {
		t.Fatalf("after 5 s: %d gateway calls, want 2", n)
	}
	// Asking is only rationed for pages: the API's and the console's Check ask every time.
	if _, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.gw.Calls(fakegw.OpStatus) - before; n != 3 {
		t.Fatalf("an explicit Check: %d gateway calls, want 3", n)
	}
}

// The page that waits for the gateway's word looks again by itself, less often each time: 1 s,
// 2 s, 4 s, … up to 30 s (the main before this change refreshed every second forever). It does
// so with the Refresh header (no JavaScript; a <meta http-equiv="refresh"> would be flagged by
// accessibility checks), and says so on the page with a "Check now" link to the same next look.
func TestCheckoutConfirmingPageRefreshesLessOften(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	s := b.payment(t, "o-wait", 1999)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	a := b.agent(t)
	path := b.orderPage("o-wait", "")
	var got []string
	for range 7 {
		rec := a.get(path)
		doc := page(t, rec, http.StatusOK)
		if st, _ := doc.Find(testid("checkout-state")).Attr("data-state"); st != "confirming" {
			t.Fatalf("state %q", st)
		}
		after, next, found := strings.Cut(rec.Header().Get("Refresh"), "; url=")
		if !found || doc.Find(`meta[http-equiv="refresh"]`).Length() != 0 {
			t.Fatalf("Refresh header %q, meta refresh tags %d", rec.Header().Get("Refresh"), doc.Find(`meta[http-equiv="refresh"]`).Length())
		}
		if now := doc.Find(testid("checkout-check-now")).AttrOr("href", ""); now != next {
			t.Fatalf("Check now links %q, the refresh goes to %q", now, next)
		}
		if say := doc.Find(testid("checkout-updates")).AttrOr("data-after", ""); say != after {
			t.Fatalf("the page says the next look is in %q s, the header %q", say, after)
		}
		got = append(got, after)
		path = next
		b.clock.Advance(time.Second)
	}
	if want := "1 2 4 8 16 30 30"; strings.Join(got, " ") != want {
		t.Fatalf("refresh intervals %v, want %s", got, want)
	}
}

// A page that reloads itself must let its reader stop that (WCAG 2.2.1): "Stop updating this
// page" leads to the same page without the Refresh header, where "Check now" looks once and
// stays off, and a link turns the updates back on. The main before this change refreshed with
// no way to stop it.
func TestCheckoutWaitingPageUpdatesCanBeTurnedOff(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	s := b.payment(t, "o-off", 1999)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	a := b.agent(t)
	doc := page(t, a.get(b.orderPage("o-off", "")), http.StatusOK)
	off := doc.Find(testid("checkout-updates-toggle")).AttrOr("href", "")
	if !strings.Contains(off, "auto=off") {
		t.Fatalf("stop link %q", off)
	}
	for range 2 {
		rec := a.get(off)
		doc = page(t, rec, http.StatusOK)
		if h := rec.Header().Get("Refresh"); h != "" {
			t.Fatalf("updates turned off, yet Refresh: %q", h)
		}
		wantText(t, doc, "checkout-updates", "off")
		off = doc.Find(testid("checkout-check-now")).AttrOr("href", "")
		if !strings.Contains(off, "auto=off") {
			t.Fatalf("Check now %q turns the updates back on", off)
		}
	}
	on := doc.Find(testid("checkout-updates-toggle")).AttrOr("href", "")
	if rec := a.get(on); strings.Contains(on, "auto=off") || rec.Header().Get("Refresh") == "" {
		t.Fatalf("turn on %q: Refresh %q", on, rec.Header().Get("Refresh"))
	}
}

// A customer who had the order's page open (a look at the gateway taken: "Continue to the
// payment page"), approves at the bank and is back within 5 s meets no fresh look: the gateway
// may not be asked yet. The page does not say "You have not been charged yet" from the
// database's stale Registered; it waits ("confirming", with its Refresh), and its next look is
// timed for when the gateway may be asked, where it shows the payment's end. A customer back
// without paying gets the way to the bank's page again at that look. The same on the return
// page and on the order's own page, where the gateway's return URL actually sends customers
// (cmd/pitlane returnURL; an outside review found the order's page showing the stale Continue).
// Negative control: with Registered shown as Continue whatever the look (on the order's page:
// the main before this change), the page within 5 s is the stale Continue without a Refresh.
func TestCheckoutReturnWithin5sWaitsForTheGatewaysWord(t *testing.T) {
	t.Parallel()
	for _, back := range []string{"/return", ""} {
		t.Run("back to "+cmp.Or(back, "the order's page"), func(t *testing.T) {
			t.Parallel()
			returnWithin5sWaits(t, back)
		})
	}
}

func returnWithin5sWaits(t *testing.T, backPath string) {
	b := newConsoleBench(t)
	a := b.agent(t)
	state := func(doc *goquery.Document) string {
		return doc.Find(testid("checkout-state")).AttrOr("data-state", "")
	}
	back := func(order string, wantAfter string) string {
		t.Helper()
		rec := a.get(b.orderPage(order, backPath))
		doc := page(t, rec, http.StatusOK)
		if st := state(doc); st != views.CheckoutConfirming {
			t.Fatalf("%s: back from the bank within 5 s: state %q, want %q", order, st, views.CheckoutConfirming)
		}
		after, next, ok := strings.Cut(rec.Header().Get("Refresh"), "; url=")
		if !ok || after != wantAfter {
			t.Fatalf("%s: Refresh %q, want the next look in %s s (when the gateway may be asked)", order, rec.Header().Get("Refresh"), wantAfter)
		}
		if doc.Find(testid("checkout-continue")).Length() != 0 {
			t.Fatalf("%s: the waiting page still says to continue to the bank", order)
		}
		return next
	}

	paid := b.payment(t, "o-back-paid", 1999)
	unpaid := b.payment(t, "o-back-unpaid", 1999)
	for _, order := range []string{"o-back-paid", "o-back-unpaid"} {
		if st := state(page(t, a.get(b.orderPage(order, "")), http.StatusOK)); st != views.CheckoutContinue {
			t.Fatalf("%s: the order's page before paying: %q", order, st)
		}
	}
	looks := b.gw.Calls(fakegw.OpStatus)
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded) // approved at the bank
	b.clock.Advance(2 * time.Second)
	nextPaid := back("o-back-paid", "3")
	nextUnpaid := back("o-back-unpaid", "3")
	if n := b.gw.Calls(fakegw.OpStatus) - looks; n != 0 {
		t.Fatalf("the returns within 5 s asked the gateway %d times", n)
	}

	b.clock.Advance(3 * time.Second) // the Refresh's time: the gateway may be asked again
	doc := page(t, a.get(nextPaid), http.StatusOK)
	wantText(t, doc, "checkout-paid", "Paid")
	doc = page(t, a.get(nextUnpaid), http.StatusOK)
	if st := state(doc); st != views.CheckoutContinue || doc.Find(testid("checkout-continue")).AttrOr("href", "") != unpaid.ConfirmationURL {
		t.Fatalf("back without paying, after the look: state %q, want the way to the bank's page", st)
	}
	if n := b.gw.Calls(fakegw.OpStatus) - looks; n != 2 {
		t.Fatalf("the looks after 5 s asked the gateway %d times, want 2", n)
	}
}
