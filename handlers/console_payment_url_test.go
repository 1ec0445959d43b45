package handlers_test

import (
	"context"
	"net/http"
	"testing"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A confirmation_url stored before GATEWAY_CONFIRMATION_HOSTS was narrowed (the gateway's host
// was found sending customers to a look-alike, say) is hidden by the API and never redirected to
// by the checkout (TrustedConfirmationURL), as docs/gateways.md promises: "Pages check stored
// URLs again before using one, so narrowing the list also covers sessions registered before."
// The console's payment page ("Payment page", the link support sends to the customer) rendered
// the stored URL as a live link without that check (hostile-input review, session 32): it shows
// payments.Service.PayableConfirmationURL now, as the API does.
func TestConsoleHidesAConfirmationURLOffTheHostList(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	b.gw.SetConfirmationURL("https://pages.old-gateway.example/p/1")
	res, err := b.svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.CreateInput{OrderID: "o-hosts", Amount: 500, Currency: "EUR"})
	if err != nil || res.Session.ConfirmationURL != "https://pages.old-gateway.example/p/1" {
		t.Fatalf("setup: %v %+v", err, res.Session)
	}
	narrowedSvc, narrowed := b.replica(b.pool, "replica-b", b.gw, func(c *payments.Config) {
		c.ConfirmationHosts = []string{"hooks.stripe.com"}
	})
	if narrowedSvc.TrustedConfirmationURL(res.Session.ConfirmationURL) {
		t.Fatal("setup: the narrowed replica trusts the URL")
	}
	sup := newAgent(t, narrowed)
	sup.login("sup@example.com")
	doc := page(t, sup.get("/payments/"+res.Session.ID), http.StatusOK)
	if href, ok := doc.Find(testid("payment-confirmation-url")).Attr("href"); ok {
		t.Errorf("the console on a replica listing other hosts links the untrusted payment page %q", href)
	}
}

// The API drops confirmation_url for a Canceling payment ("the shop sends the customer to pay
// money we are reversing": TestACancelingPaymentOffersNoConfirmationURL) and the checkout offers
// no way to pay it; the console's payment page still linked the gateway's payment page for it,
// the link support reads to a customer on the phone (hostile-input review, session 32).
func TestConsoleOffersNoConfirmationURLWhileCanceling(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	ctx := context.Background()
	api := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	res, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-canceling", Amount: 500, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil || res.Session.ConfirmationURL == "" {
		t.Fatalf("setup: %v %+v", err, res.Session)
	}
	ch, err := b.svc.RequestCancel(ctx, api, res.Session.ID)
	if err != nil {
		t.Fatal(err)
	}
	var body string
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1 ORDER BY id DESC LIMIT 1`, res.Session.ID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	m := codeRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no code in %q", body)
	}
	b.gw.Fail(fakegw.OpReverse, fakegw.Transient, 1)
	if _, err := b.svc.ConfirmCancel(ctx, api, res.Session.ID, ch.ID, m[1]); err != nil {
		t.Fatalf("confirm: %v", err)
	}
	sup := b.agent(t)
	sup.login("sup@example.com")
	doc := page(t, sup.get("/payments/"+res.Session.ID), http.StatusOK)
	if st := text(doc, "payment-status"); st != "Canceling" {
		t.Fatalf("status %q, want Canceling", st)
	}
	if href, ok := doc.Find(testid("payment-confirmation-url")).Attr("href"); ok {
		t.Errorf("a Canceling payment's console page links the gateway's payment page %q", href)
	}
}
