package handlers_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
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
		path := "/checkout/o-looks"
		if i%3 == 0 {
			path += "/return"
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
	doc := page(t, newAgent(t, other).get("/checkout/o-looks/return"), http.StatusOK)
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
// 2 s, 4 s, … up to 30 s (the main before this change refreshed every second forever).
func TestCheckoutConfirmingPageRefreshesLessOften(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	s := b.payment(t, "o-wait", 1999)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	a := b.agent(t)
	path := "/checkout/o-wait"
	var got []string
	for range 7 {
		doc := page(t, a.get(path), http.StatusOK)
		if st, _ := doc.Find(testid("checkout-state")).Attr("data-state"); st != "confirming" {
			t.Fatalf("state %q", st)
		}
		content, ok := doc.Find(`meta[http-equiv="refresh"]`).Attr("content")
		after, next, found := strings.Cut(content, "; url=")
		if !ok || !found {
			t.Fatalf("refresh %q", content)
		}
		got = append(got, after)
		path = next
		b.clock.Advance(time.Second)
	}
	if want := "1 2 4 8 16 30 30"; strings.Join(got, " ") != want {
		t.Fatalf("refresh intervals %v, want %s", got, want)
	}
}
