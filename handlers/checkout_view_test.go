package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// An order's checkout page opens only with a genuine checkout link of the order (an expired one
// too) or with the order's page token (payments.OrderPageToken), which every URL pitlane hands
// out for the page carries — the gateway's return URL first. Order ids are the shop's and often
// guessable: before, /checkout/{order} showed anyone whether an order was paid and its amount,
// asked the gateway, and offered a retry Pay form for a declined one (an outside audit).
func TestCheckoutPageOpensOnlyWithALinkOrItsToken(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	bank := &storyGateway{Gateway: b.gw, base: "https://bank.example", returns: map[string]string{}}
	svc, e := b.replica(b.pool, "replica-view", bank, func(c *payments.Config) {
		c.ReturnURL = func(s payments.Session) string { return "https://shop.example" + payments.CheckoutPath(s.OrderID) }
	})
	ctx := context.Background()
	pay := func(order string, st payments.GatewayStatus) payments.Session {
		res, err := svc.Create(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, payments.CreateInput{OrderID: order, Amount: 1999, Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		b.gw.SetStatus(res.Session.GatewayPaymentID, st)
		s, err := svc.Check(ctx, payments.Actor{Kind: payments.ActorSystem}, res.Session.ID)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	paid := pay("o-private", payments.GatewaySucceeded)
	// The declined order had a checkout link: its page may retry while the link is valid
	// (payments.CheckoutRetry).
	if _, err := svc.CheckoutLink(ctx, "o-declined-private", 1999, "EUR", 0); err != nil {
		t.Fatal(err)
	}
	pay("o-declined-private", payments.GatewayDeclined)

	// The return URL the gateway got carries the order's page token, and opens the page.
	ret, err := url.Parse(bank.returns[paid.GatewayPaymentID])
	if err != nil || ret.Query().Get(payments.OrderPageParam) != svc.OrderPageToken("o-private") || svc.OrderPageToken("o-private") == "" {
		t.Fatalf("return URL %q: want the order's page token", bank.returns[paid.GatewayPaymentID])
	}
	a := newAgent(t, e)
	if doc := page(t, a.get(ret.RequestURI()), http.StatusOK); text(doc, "checkout-paid") == "" {
		t.Fatal("the return URL does not show the paid order")
	}

	asked := b.gw.Calls(fakegw.OpStatus)
	stranger := newAgent(t, e)
	otherTok := svc.OrderPageToken("o-declined-private")
	for _, path := range []string{
		"/checkout/o-private", "/checkout/o-private/return",
		"/checkout/o-private?view=" + strings.Repeat("0", 32),
		"/checkout/o-private?view=" + otherTok, // another order's token
		"/checkout/o-private?view=" + svc.OrderPageToken("o-private")[:31],
		"/checkout/o-declined-private", "/checkout/o-nobody-ordered",
	} {
		rec := stranger.get(path)
		body := rec.Body.String()
		if rec.Code != http.StatusNotFound || strings.Contains(body, "19.99") || strings.Contains(strings.ToLower(body), "paid") ||
			strings.Contains(body, "checkout-form") {
			t.Errorf("GET %s = %d; want the page of an order that does not exist:\n%s", path, rec.Code, body)
		}
	}
	if n := b.gw.Calls(fakegw.OpStatus) - asked; n != 0 {
		t.Fatalf("pages refused to strangers asked the gateway %d times", n)
	}

	// A forged retry of the declined order (its last amount, no link, no token) starts nothing;
	// the retry form of the order's own page (which carries the token) does.
	stranger.get("/login") // a CSRF cookie and token, as the sign-in page gives anyone
	forged := url.Values{"intent": {uuid.NewString()}, "amount": {"1999"}, "currency": {"EUR"}}
	if rec := stranger.post("/checkout/o-declined-private", forged); rec.Code != http.StatusBadRequest || strings.Contains(rec.Body.String(), "19.99") {
		t.Fatalf("forged retry = %d:\n%s", rec.Code, rec.Body)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-declined-private'`); n != 1 {
		t.Fatalf("sessions after the forged retry = %d, want 1", n)
	}
	customer := newAgent(t, e)
	action, form := payForm(t, customer, b.orderPage("o-declined-private", ""))
	if form.Get(payments.OrderPageParam) != otherTok || form.Has("sig") {
		t.Fatalf("retry form %v: want the page token and no sig", form)
	}
	if rec := customer.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("the page's own retry = %d %s", rec.Code, rec.Body)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-declined-private'`); n != 2 {
		t.Fatalf("sessions after the page's retry = %d, want 2", n)
	}

	// A genuine link opens the page of a new order; so does an expired genuine one (the
	// customer had it); a changed one gets the bad-link page and nothing of the order.
	link, err := svc.CheckoutLink(ctx, "o-linked", 500, "EUR", 0)
	if err != nil {
		t.Fatal(err)
	}
	page(t, stranger.get(link.Path()), http.StatusOK)
	if rec := stranger.get(strings.Replace(link.Path(), "amount=500", "amount=5", 1)); rec.Code != http.StatusBadRequest {
		t.Fatalf("changed link = %d", rec.Code)
	}
	b.clock.Advance(payments.DefaultCheckoutLinkTTL + 1)
	page(t, stranger.get(link.Path()), http.StatusGone)
}
