package payments_test

import (
	"context"
	"strings"
	"testing"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// withReference reads payment id with reference ref, as a gateway answers another shop's
// payment on a shared account.
type withReference struct {
	*fakegw.Gateway
	id, ref string
}

func (g *withReference) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	gp, err := g.Gateway.Status(ctx, id)
	if err == nil && id == g.id {
		gp.Reference = g.ref
	}
	return gp, err
}

// An event about a captured payment that names, by its reference, a session of another gateway
// (GATEWAY changed) opens a duplicate_gateway_payment case there (the customer may have paid at
// this gateway) — only when the gateway's own read of the payment carries that session's
// reference exactly. The event's word alone opened it, and so did a reference that only casts to
// the session's id (upper case): another shop's payment on a shared account held the order's
// checkout (a review of answers about other things). Negative controls (run by hand): without
// the reference compared, a case for the first; without it and the lower-case rule (each stops
// the second alone), a case for both.
func TestAnEventOfAPaymentWithAnotherReferenceHoldsNoSessionOfAnotherGateway(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ev   func(old payments.Session, gp string) payments.GatewayEvent
		ref  func(old payments.Session) string // the reference the gateway reads for the payment
	}{
		{"the event's reference, the gateway's another", func(old payments.Session, gp string) payments.GatewayEvent {
			return payments.GatewayEvent{ID: "evt-ref", Type: "payment.updated", PaymentID: gp, Reference: old.ID}
		}, func(payments.Session) string { return "someone-else" }},
		{"the session's id in upper case", func(old payments.Session, gp string) payments.GatewayEvent {
			return payments.GatewayEvent{ID: "evt-up", Type: "payment_intent.succeeded", PaymentID: gp}
		}, func(old payments.Session) string { return strings.ToUpper(old.ID) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx := context.Background()
			old := b.failed(t, "o-hint-other-ref", 1000)
			b.exec(t, `UPDATE payment_sessions SET gateway = 'old' WHERE id = $1`, old.ID)
			gp, err := b.gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: "other-shop", Reference: "x", Amount: 1000, Currency: "EUR"})
			if err != nil {
				t.Fatal(err)
			}
			b.gw.SetStatus(gp.ID, payments.GatewaySucceeded)
			svc := b.service(b.pool, "replica-hint-ref", func(c *payments.Config) {
				c.Gateway = &withReference{Gateway: b.gw, id: gp.ID, ref: tc.ref(old)}
			})
			_, _ = svc.HandleGatewayEvent(ctx, tc.ev(old, gp.ID))
			cases := b.texts(t, `SELECT detail FROM finance_cases WHERE session_id = $1`, old.ID)
			inReview, err := b.svc.PaymentInReview(ctx, old.OrderID)
			if err != nil {
				t.Fatal(err)
			}
			if len(cases) > 0 || inReview {
				t.Fatalf("payment %s, its reference %q at the gateway, opened cases %q on session %s; order in review %v", gp.ID, tc.ref(old), cases, old.ID, inReview)
			}
		})
	}
}
