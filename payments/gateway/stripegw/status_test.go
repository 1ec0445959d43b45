package stripegw

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"

	"pitlane/payments"
)

func TestMapStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status stripe.PaymentIntentStatus
		reason stripe.PaymentIntentCancellationReason
		want   payments.GatewayStatus
	}{
		{stripe.PaymentIntentStatusRequiresPaymentMethod, "", payments.GatewayPending},
		{stripe.PaymentIntentStatusRequiresConfirmation, "", payments.GatewayPending},
		{stripe.PaymentIntentStatusRequiresAction, "", payments.GatewayPending},
		{stripe.PaymentIntentStatusProcessing, "", payments.GatewayPending},
		{stripe.PaymentIntentStatusRequiresCapture, "", payments.GatewayAuthorized},
		{stripe.PaymentIntentStatusSucceeded, "", payments.GatewaySucceeded},
		// canceled by a merchant call (ours sends requested_by_customer) → reversed
		{stripe.PaymentIntentStatusCanceled, "", payments.GatewayReversed},
		{stripe.PaymentIntentStatusCanceled, stripe.PaymentIntentCancellationReasonRequestedByCustomer, payments.GatewayReversed},
		{stripe.PaymentIntentStatusCanceled, stripe.PaymentIntentCancellationReasonDuplicate, payments.GatewayReversed},
		{stripe.PaymentIntentStatusCanceled, stripe.PaymentIntentCancellationReasonFraudulent, payments.GatewayReversed},
		{stripe.PaymentIntentStatusCanceled, stripe.PaymentIntentCancellationReasonAbandoned, payments.GatewayReversed},
		// canceled by Stripe on its own → never a reversal we did not ask for
		{stripe.PaymentIntentStatusCanceled, stripe.PaymentIntentCancellationReasonAutomatic, payments.GatewayExpired},
		{stripe.PaymentIntentStatusCanceled, stripe.PaymentIntentCancellationReasonExpired, payments.GatewayExpired},
		{stripe.PaymentIntentStatusCanceled, stripe.PaymentIntentCancellationReasonFailedInvoice, payments.GatewayDeclined},
		{stripe.PaymentIntentStatusCanceled, stripe.PaymentIntentCancellationReasonVoidInvoice, payments.GatewayDeclined},
		{stripe.PaymentIntentStatusCanceled, "some_future_reason", payments.GatewayDeclined},
		// a status Stripe adds later is "not final yet"
		{"some_future_status", "", payments.GatewayPending},
	}
	for _, tc := range tests {
		if got := mapStatus(tc.status, tc.reason); got != tc.want {
			t.Errorf("mapStatus(%q, %q) = %q, want %q", tc.status, tc.reason, got, tc.want)
		}
	}
}

func TestPaymentOf(t *testing.T) {
	t.Parallel()
	decode := func(s string) *stripe.PaymentIntent {
		t.Helper()
		var pi stripe.PaymentIntent
		if err := json.Unmarshal([]byte(s), &pi); err != nil {
			t.Fatal(err)
		}
		return &pi
	}

	p := paymentOf(decode(`{"id":"pi_1","object":"payment_intent","status":"requires_action","amount":1999,"currency":"eur",
		"created":1764489600,"metadata":{"reference":"R-1"},
		"next_action":{"type":"redirect_to_url","redirect_to_url":{"url":"https://hooks.stripe.com/3ds/x","return_url":"https://shop/r"}}}`))
	want := payments.GatewayPayment{ID: "pi_1", Status: payments.GatewayPending, Amount: 1999, Currency: "EUR", Reference: "R-1",
		ConfirmationURL: "https://hooks.stripe.com/3ds/x", Created: time.Unix(1764489600, 0).UTC()}
	if p != want {
		t.Fatalf("paymentOf = %+v\nwant        %+v", p, want)
	}

	// A succeeded intent is worth what Stripe received, not what it asked for: a partial capture
	// of 1999 that took 100 says 100, so the core refuses to complete a 1999 session with it.
	p = paymentOf(decode(`{"id":"pi_6","object":"payment_intent","status":"succeeded","amount":1999,"amount_received":100,"currency":"eur"}`))
	if p.Status != payments.GatewaySucceeded || p.Amount != 100 || p.Currency != "EUR" {
		t.Fatalf("partially captured = %+v, want succeeded 100 EUR", p)
	}
	p = paymentOf(decode(`{"id":"pi_7","object":"payment_intent","status":"succeeded","amount":1999,"amount_received":1999,"currency":"usd"}`))
	if p.Amount != 1999 || p.Currency != "USD" {
		t.Fatalf("captured = %+v, want 1999 USD", p)
	}

	// A declined attempt leaves the intent open for another card: pending, with the reason.
	p = paymentOf(decode(`{"id":"pi_2","object":"payment_intent","status":"requires_payment_method","amount":5,"currency":"usd",
		"last_payment_error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds"}}`))
	if p.Status != payments.GatewayPending || p.DeclineCode != "insufficient_funds" {
		t.Fatalf("declined attempt = %+v", p)
	}
	p = paymentOf(decode(`{"id":"pi_3","object":"payment_intent","status":"requires_payment_method","last_payment_error":{"type":"card_error","code":"expired_card"}}`))
	if p.DeclineCode != "expired_card" {
		t.Fatalf("decline without decline_code = %+v", p)
	}
	// Closed by Stripe for an invoice reason: declined, the reason is the decline code.
	p = paymentOf(decode(`{"id":"pi_4","object":"payment_intent","status":"canceled","cancellation_reason":"failed_invoice"}`))
	if p.Status != payments.GatewayDeclined || p.DeclineCode != "failed_invoice" {
		t.Fatalf("failed invoice = %+v", p)
	}
	// Our own reversal carries no decline code.
	p = paymentOf(decode(`{"id":"pi_5","object":"payment_intent","status":"canceled","cancellation_reason":"requested_by_customer"}`))
	if p.Status != payments.GatewayReversed || p.DeclineCode != "" {
		t.Fatalf("reversed = %+v", p)
	}
}

func TestRefundStatus(t *testing.T) {
	t.Parallel()
	for s, want := range map[stripe.RefundStatus]string{
		stripe.RefundStatusSucceeded:      "succeeded",
		stripe.RefundStatusPending:        "pending",
		stripe.RefundStatusRequiresAction: "pending",
		stripe.RefundStatusFailed:         "failed",
		stripe.RefundStatusCanceled:       "failed",
		"something_new":                   "pending",
	} {
		if got := refundStatus(s); got != want {
			t.Errorf("refundStatus(%q) = %q, want %q", s, got, want)
		}
	}
}
