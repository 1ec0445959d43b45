package stripegw

import (
	"github.com/stripe/stripe-go/v82"

	"pitlane/payments"
)

// mapStatus translates a PaymentIntent's status (and, for canceled ones, its cancellation
// reason) into the gateway status the core understands.
//
//	PaymentIntent status       cancellation_reason                      → GatewayStatus → session
//	requires_payment_method    –                                        → pending       → Registered
//	requires_confirmation      –                                        → pending       → Registered
//	requires_action            –                                        → pending       → Registered
//	processing                 –                                        → pending       → Registered (checked again)
//	requires_capture           –                                        → authorized    → Authorized
//	succeeded                  –                                        → succeeded     → Completed
//	canceled                   none, requested_by_customer, duplicate,
//	                           fraudulent, abandoned                    → reversed      → Canceled
//	canceled                   automatic, expired                       → expired       → Failed
//	canceled                   failed_invoice, void_invoice, unknown    → declined      → Failed
//	anything else (a status Stripe adds later)                          → pending       → checked again
//
// Why these choices:
//   - A card decline does not end a PaymentIntent: it goes back to requires_payment_method with
//     last_payment_error set, and the customer may try another card. So a decline is pending
//     (DeclineCode carries the reason), not declined; only Stripe closing the intent is final.
//   - processing means the money is moving (bank debits, some wallets); the outcome is not known
//     yet, so the session stays open and the sweeper checks again. It is not Unknown: Stripe did
//     answer, and it told us to wait.
//   - canceled: Stripe does not say WHO canceled, only why. The four reasons the cancel API accepts
//     (requested_by_customer, duplicate, fraudulent, abandoned) and no reason at all can only
//     come from a merchant call: our Reverse (which sends requested_by_customer) or someone
//     with the account's keys or Dashboard. That is a reversal. The reasons only Stripe sets are
//     Stripe closing the payment on its own: automatic (e.g. an authorization that was never
//     captured lapsed) and expired (its Checkout Session expired) mean the payment simply never
//     completed → expired; the invoice reasons (and any reason Stripe adds later) mean the
//     payment failed for a reason outside the session → declined, with the reason as DeclineCode.
//     Either way the session fails; it is never reported as a reversal we did not ask for.
//   - An unknown status is pending rather than an error: "not final yet" is the only safe reading,
//     because a session is closed only on the gateway's clear word.
func mapStatus(s stripe.PaymentIntentStatus, reason stripe.PaymentIntentCancellationReason) payments.GatewayStatus {
	switch s {
	case stripe.PaymentIntentStatusRequiresPaymentMethod,
		stripe.PaymentIntentStatusRequiresConfirmation,
		stripe.PaymentIntentStatusRequiresAction,
		stripe.PaymentIntentStatusProcessing:
		return payments.GatewayPending
	case stripe.PaymentIntentStatusRequiresCapture:
		return payments.GatewayAuthorized
	case stripe.PaymentIntentStatusSucceeded:
		return payments.GatewaySucceeded
	case stripe.PaymentIntentStatusCanceled:
		switch reason {
		case "",
			stripe.PaymentIntentCancellationReasonRequestedByCustomer,
			stripe.PaymentIntentCancellationReasonDuplicate,
			stripe.PaymentIntentCancellationReasonFraudulent,
			stripe.PaymentIntentCancellationReasonAbandoned:
			return payments.GatewayReversed
		case stripe.PaymentIntentCancellationReasonAutomatic,
			stripe.PaymentIntentCancellationReasonExpired:
			return payments.GatewayExpired
		default: // failed_invoice, void_invoice, and reasons Stripe adds later
			return payments.GatewayDeclined
		}
	default:
		return payments.GatewayPending
	}
}
