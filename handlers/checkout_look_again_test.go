package handlers_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/views"
)

// A waiting page whose own next look meets a moment without the database looks again by itself
// from the 503 page (an outside review: the 503 page had only Retry-After, which a browser
// ignores on a page, so the customer's "This page updates itself" stopped for good, the payment
// Paid a second later). The 503 page's Refresh is the waiting page's next look, backing off as
// it does; a page the customer turned off (auto=off) is left alone. Negative control: without
// the Refresh in web's checkoutError, the first check fails.
func TestAWaitingPageLooksAgainThroughA503(t *testing.T) {
	b := newConsoleBench(t)
	s := b.payment(t, "o-503", 1999)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	a := b.agent(t)
	rec := a.get(b.orderPage("o-503", ""))
	if st := page(t, rec, http.StatusOK).Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutConfirming {
		t.Fatalf("state %q, want confirming", st)
	}
	_, next, ok := strings.Cut(rec.Header().Get("Refresh"), "; url=")
	if !ok {
		t.Fatalf("the waiting page has no Refresh: %q", rec.Header().Get("Refresh"))
	}
	var db string
	if err := b.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	restore := outage(t, db)
	rec = a.get(next) // the page's own next look, during the outage
	off := a.get(next + "&auto=off")
	restore()
	doc := page(t, rec, http.StatusServiceUnavailable)
	wantText(t, doc, "error-refresh", "looks again by itself in 2 seconds")
	// It can be stopped, as the waiting page it stands for can (WCAG 2.2.1; an outside review,
	// a11y: the 503 page reloaded itself with no way to stop it).
	stop := doc.Find(testid("checkout-updates-toggle")).AttrOr("href", "")
	if !strings.Contains(stop, "auto=off") || strings.Contains(stop, "look=") || !strings.HasPrefix(stop, "/checkout/o-503?") {
		t.Fatalf("the 503 page's stop link = %q, want the order's page with auto=off", stop)
	}
	after, again, ok := strings.Cut(rec.Header().Get("Refresh"), "; url=")
	if !ok || after != "2" || !strings.Contains(again, "look=2") || !strings.HasPrefix(again, "/checkout/o-503?") {
		t.Fatalf("the 503 of look 1 refreshes with %q, want the next look (look=2) of the order's page in 2 s", rec.Header().Get("Refresh"))
	}
	if r := off.Header().Get("Refresh"); off.Code != http.StatusServiceUnavailable || r != "" {
		t.Fatalf("a page turned off met a 503: %d, Refresh %q, want none", off.Code, r)
	}
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded) // paid while the page waited
	b.clock.Advance(5 * time.Second)
	stopped := a.get(stop)
	if r := stopped.Header().Get("Refresh"); r != "" {
		t.Fatalf("the page the stop link opened reloads itself: %q", r)
	}
	doc = page(t, a.get(again), http.StatusOK)
	if st := doc.Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutPaid {
		t.Fatalf("the page looked again after the outage: state %q, want paid", st)
	}
}

// A waiting page backs off (1 2 4 8 16 30 s) also while it waits because the gateway does not
// answer about its Registered payment: the wait for the gateway's next turn (5 s) is a floor,
// not the interval (an outside review: every look came back in 5 s, 720 reloads an hour, each
// read from the top by a screen reader). Negative control: u.After = wait alone in
// selfUpdatesAt gives 5 on every look.
func TestAWaitingPageBacksOffWhileTheGatewayDoesNotAnswer(t *testing.T) {
	b := newConsoleBench(t)
	b.payment(t, "o-stale", 1999) // Registered: the customer is at the gateway
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1000)
	a := b.agent(t)
	path := b.orderPage("o-stale", "")
	var got []string
	for range 8 {
		rec := a.get(path)
		if st := page(t, rec, http.StatusOK).Find(testid("checkout-state")).AttrOr("data-state", ""); st != views.CheckoutConfirming {
			t.Fatalf("state %q, want confirming", st)
		}
		after, next, ok := strings.Cut(rec.Header().Get("Refresh"), "; url=")
		if !ok {
			t.Fatal("no Refresh")
		}
		got = append(got, after)
		path = next
		d, _ := time.ParseDuration(after + "s")
		b.clock.Advance(d)
	}
	if strings.Join(got, " ") != "5 5 5 8 16 30 30 30" {
		t.Fatalf("refresh intervals %v while the gateway does not answer, want 5 5 5 8 16 30 30 30 (its turn, then the back-off)", got)
	}
}
