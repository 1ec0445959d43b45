package handlers_test

import (
	"context"
	"net/http"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// A payment the gateway contradicts (it holds 9.00 of a 10.00 payment: a gateway_mismatch case)
// cannot be canceled (payments.mismatchRefusal), yet its page offered "Request cancel", and a
// code requested before its code form, and every click was refused. The page says why instead
// (the core's own query: PaymentDetail.CancelRefused); a payment without such a case keeps the
// form.
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
	// A cancel code requested before the gateway's word came: its form and its "Enter code" go
	// too (they were offered and refused, a review of this page's rule).
	doc := page(t, sup.get("/payments/"+s.ID), http.StatusOK)
	action, form := formValues(doc, "cancel-request-form")
	doc = page(t, sup.follow(sup.post(action, form)), http.StatusOK)
	codePage := doc.Find(testid("cancel-confirm-form")).AttrOr("action", "")
	if codePage == "" {
		t.Fatal("setup: no cancel code form")
	}
	b.gw.SetAmount(s.GatewayPaymentID, 900, "EUR")
	if _, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID); err != nil {
		t.Fatal(err)
	}
	doc = page(t, sup.get("/payments/"+s.ID), http.StatusOK)
	if doc.Find(testid("cancel-request")).Length() != 0 {
		t.Error("the page offers Request cancel of a payment the gateway contradicts")
	}
	wantText(t, doc, "cancel-refused", "does not match")
	if n := doc.Find(testid("enter-code")).Length(); n != 0 {
		t.Errorf("the page offers %d Enter code link(s) of a cancel the core refuses", n)
	}
	var challenge string
	if err := b.pool.QueryRow(ctx, `SELECT id::text FROM cancel_challenges WHERE session_id = $1`, s.ID).Scan(&challenge); err != nil {
		t.Fatal(err)
	}
	if doc := page(t, sup.get("/payments/"+s.ID+"?challenge="+challenge), http.StatusOK); doc.Find(testid("cancel-confirm-form")).Length() != 0 {
		t.Error("the code's page offers the cancel code form of a cancel the core refuses")
	}
	if doc := page(t, sup.get("/payments/"+plain.ID), http.StatusOK); doc.Find(testid("cancel-request")).Length() != 1 || doc.Find(testid("cancel-refused")).Length() != 0 {
		t.Error("a payment the gateway agrees with lost its Request cancel")
	}
}
