package handlers_test

import (
	"context"
	"net/http"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// A payment the gateway contradicts (it holds 9.00 of a 10.00 payment: a gateway_mismatch case)
// cannot be canceled (payments.mismatchRefusal), yet its page offered "Request cancel" and every
// click was refused. The page says why instead; a payment without such a case keeps the form.
// Negative control (run by hand): without PaymentDetail.CancelRefused, the form is offered.
func TestThePaymentPageOffersNoCancelTheGatewayContradicts(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	ctx := context.Background()
	s := b.payment(t, "o-page-cancel-mismatch", 1000)
	plain := b.payment(t, "o-page-cancel-plain", 1000)
	b.gw.SetAmount(s.GatewayPaymentID, 900, "EUR")
	if _, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	doc := page(t, sup.get("/payments/"+s.ID), http.StatusOK)
	if doc.Find(testid("cancel-request")).Length() != 0 {
		t.Error("the page offers Request cancel of a payment the gateway contradicts")
	}
	wantText(t, doc, "cancel-refused", "does not match")
	if doc := page(t, sup.get("/payments/"+plain.ID), http.StatusOK); doc.Find(testid("cancel-request")).Length() != 1 || doc.Find(testid("cancel-refused")).Length() != 0 {
		t.Error("a payment the gateway agrees with lost its Request cancel")
	}
}
