package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// While the gateway may hold the order's money (PaymentInReview: here an open late_payment
// case) the checkout sends nobody to a payment's page at the bank. The API's payment object
// handed the order's Registered payment's confirmation_url out all the same — shops send their
// customers to it — and so did the shop's Create answering that payment (200): a second charge
// while the checkout said "you will not be charged twice" (an outside review). Negative control:
// PayableConfirmationURL without its PaymentInReview.
func TestAPIGivesNoBankPageWhileTheOrderIsInReview(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	ctx := context.Background()
	const order = "o-review-url"
	body := `{"amount":1999,"currency":"EUR"}`
	// S1 is declined: Failed.
	p1 := wantPayment(t, b.do(post(createPath(order), body)), http.StatusCreated)
	b.gw.SetStatus(*p1.GatewayPaymentID, payments.GatewayDeclined)
	if p := wantPayment(t, b.do(post("/api/v1/payments/"+p1.ID+"/check", "")), http.StatusOK); p.Status != "Failed" {
		t.Fatalf("setup: S1 %s", p.Status)
	}
	// The shop tries again: S2, Registered, its page at the bank.
	p2 := wantPayment(t, b.do(post(createPath(order), body)), http.StatusCreated)
	if p2.Status != "Registered" || p2.ConfirmationURL == nil {
		t.Fatalf("setup: S2 %s %v", p2.Status, p2.ConfirmationURL)
	}
	// The bank took S1's money after all: a late_payment case; the order is in review.
	b.gw.SetStatus(*p1.GatewayPaymentID, payments.GatewaySucceeded)
	wantPayment(t, b.do(post("/api/v1/payments/"+p1.ID+"/check", "")), http.StatusOK)
	inReview, err := b.svc.PaymentInReview(ctx, order)
	if err != nil || !inReview {
		t.Fatalf("setup: PaymentInReview = %v, %v", inReview, err)
	}
	// The checkout refuses the way to the bank for this order (a Pay click: ErrPaymentInReview).
	_, perr := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: order, Amount: 1999, Currency: "EUR"}, 0)
	if perr != payments.ErrPaymentInReview {
		t.Fatalf("setup: the checkout's Pay click answered %v, want ErrPaymentInReview", perr)
	}
	// The API hands the shop S2's page at the bank all the same.
	if g := wantPayment(t, b.do(get("/api/v1/payments/"+p2.ID)), http.StatusOK); g.ConfirmationURL != nil {
		t.Errorf("GET S2 while the order is in review (late payment of S1 held): confirmation_url = %q, want null (the checkout sends nobody there)", *g.ConfirmationURL)
	}
	if g := wantPayment(t, b.do(post(createPath(order), body)), http.StatusOK); g.ConfirmationURL != nil {
		t.Errorf("the shop's Create while the order is in review answers S2 (%s) with confirmation_url = %q", g.ID, *g.ConfirmationURL)
	}
}

// The same on the console: the payment page's "Payment page" link (the one support reads to a
// customer on the phone) was S2's bank page while the order is in review.
func TestConsoleLinksNoBankPageWhileTheOrderIsInReview(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	ctx := context.Background()
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	in := payments.CreateInput{OrderID: "o-review-console", Amount: 500, Currency: "EUR"}
	r1, err := b.svc.Create(ctx, shop, in)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(r1.Session.GatewayPaymentID, payments.GatewayDeclined)
	if s, err := b.svc.Check(ctx, shop, r1.Session.ID); err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	r2, err := b.svc.Create(ctx, shop, in)
	if err != nil || r2.Session.ConfirmationURL == "" {
		t.Fatalf("setup: %v %+v", err, r2.Session)
	}
	b.gw.SetStatus(r1.Session.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(ctx, shop, r1.Session.ID); err != nil {
		t.Fatal(err)
	}
	if in, err := b.svc.PaymentInReview(ctx, in.OrderID); err != nil || !in {
		t.Fatalf("setup: PaymentInReview = %v %v", in, err)
	}
	sup := b.agent(t)
	sup.login("sup@example.com")
	doc := page(t, sup.get("/payments/"+r2.Session.ID), http.StatusOK)
	if href, ok := doc.Find(testid("payment-confirmation-url")).Attr("href"); ok {
		t.Errorf("the console links S2's payment page %q while the order is in review (S1's late payment held)", href)
	}
}

// The console's "Payment started" flash told support to send the customer "the payment page
// link below" when the page shows none: a registration whose answer was lost (Unknown), or an
// order in review. Negative control: the flash's sentence unconditional.
func TestConsoleCreateOffersNoLinkItDoesNotShow(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	doc := page(t, sup.follow(sup.post("/payments", url.Values{"order_id": {"o-lost-answer"}, "amount": {"5.00"}, "currency": {"EUR"}})), http.StatusOK)
	wantText(t, doc, "flash", "Payment started: Unknown")
	if strings.Contains(text(doc, "flash"), "link below") || doc.Find(testid("payment-confirmation-url")).Length() != 0 {
		t.Errorf("flash %q with %d payment page links", text(doc, "flash"), doc.Find(testid("payment-confirmation-url")).Length())
	}
}
