package fakegw_test

import (
	"context"
	"errors"
	"testing"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// TestRefundKeyIsAnsweredBeforeThePaymentsStatus: a refund's key sent again is the same refund
// (gateway-api.md: "the same key again → the same refund, 200"), even after the payment was
// declined since — as gatewaysim answers, whose key check comes before the operation looks at
// the payment. A new key on that payment is still 409 not_refundable. Negative control: the
// status check before the key lookup (as fakegw had it, found by the fifth chaos day) answers
// the repeat 409 not_refundable.
func TestRefundKeyIsAnsweredBeforeThePaymentsStatus(t *testing.T) {
	ctx := context.Background()
	g := fakegw.New()
	p, err := g.Register(ctx, payments.RegisterRequest{IdempotencyKey: "reg", Reference: "ref", Amount: 1000, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	g.SetStatus(p.ID, payments.GatewaySucceeded)
	first, err := g.Refund(ctx, p.ID, "rk", 400, "EUR")
	if err != nil {
		t.Fatal(err)
	}
	g.SetStatus(p.ID, payments.GatewayDeclined) // the gateway takes the capture back

	again, err := g.Refund(ctx, p.ID, "rk", 400, "EUR")
	if err != nil || again != first {
		t.Fatalf("the same key after the decline = %+v %v, want the earlier refund %+v", again, err, first)
	}
	if n := g.Refunds(p.ID); n != 1 {
		t.Fatalf("%d refunds, want 1", n)
	}
	_, err = g.Refund(ctx, p.ID, "rk-new", 400, "EUR")
	var ge *payments.GatewayError
	if !errors.As(err, &ge) || ge.HTTPStatus != 409 || ge.Code != "not_refundable" {
		t.Fatalf("a new key on a declined payment = %v, want 409 not_refundable", err)
	}
}
