package stripegw

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"

	"github.com/stripe/stripe-go/v82"

	"pitlane/payments"
)

// callInfo is what one adapter call saw on the wire. stripe-go returns a transport error as is,
// and a non-JSON error body (a proxy's 502 page) as a plain error without the status, so the
// adapter watches the call itself: through an httptrace hook (did we ever get a connection?)
// and a wrapper around the transport (which HTTP status came back?). Both travel in the request
// context, so concurrent calls never see each other's facts.
type callInfo struct {
	gotConn atomic.Bool  // a connection was obtained: from here on, bytes may have reached Stripe
	status  atomic.Int32 // the HTTP status of the last response, 0 when none arrived
}

type callInfoKey struct{}

// observe starts watching one call.
func observe(ctx context.Context) (context.Context, *callInfo) {
	ci := &callInfo{}
	ctx = context.WithValue(ctx, callInfoKey{}, ci)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { ci.gotConn.Store(true) },
	})
	return ctx, ci
}

// observingTransport records the status of every response into the call's callInfo, and turns
// a redirect into a failure: followed, it re-sent a POST — its Idempotency-Key and, to any port
// of the same host, the secret key — somewhere else and applied that answer as Stripe's (an
// outside review, stripe2); handed to stripe-go, which reads any body under 400 as the resource,
// a 307 with a JSON body (an API gateway's, an egress proxy's) was Stripe's answer — FindRefund's
// "not found", the core's licence to refund again (a review of that fix). With the status
// recorded and no response, classify answers unknown, as refgw reads a 3xx.
type observingTransport struct{ base http.RoundTripper }

func (t *observingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if ci, ok := req.Context().Value(callInfoKey{}).(*callInfo); ok {
		ci.status.Store(int32(resp.StatusCode))
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		resp.Body.Close()
		return nil, fmt.Errorf("stripegw: a redirect (%d) is not Stripe's answer", resp.StatusCode)
	}
	return resp, err
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the wrapped transport.
func (t *observingTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// classify turns any failure of a call into a *payments.GatewayError of exactly one kind.
//
//   - Stripe answered with an error object (*stripe.Error):
//     5xx → unknown (Stripe may have acted; its own docs say so for 500s);
//     429 (rate_limit, lock_timeout) and any 409 → unknown: Stripe did not act on THIS
//     request, but the answer is "try again later", and a 409 is "conflicts with another request
//     (perhaps due to using the same idempotent key)": another request with our key is running
//     right now and may well create the payment or the refund, so declaring it refused would be
//     a lie with money attached — whatever the body says (idempotency_key_in_use, or only the
//     type idempotency_error, as Stripe has answered too; an outside review);
//     an idempotency_error on 400 (the same key with other parameters, "idempotency_key_reused")
//     → unknown too: Stripe holds an earlier request under our key, which it may have acted on —
//     one whose wire form a deploy changed (a currency's units), or another replica's with its
//     own return URL. Called a refusal, a refund so answered was settled Failed and its amount
//     refunded again (an outside review); refgw classifies its idempotency_key_reused the same;
//     a 408, or an error object without Stripe's type (a proxy's JSON) → unknown;
//     any other 4xx → definitive, with the codes the core knows translated:
//     404 resource_missing, and a refund's 400 resource_missing of its payment_intent → "not_found";
//     payment_intent_unexpected_state → "not_reversible" (reverse) / "not_refundable" (refund),
//     with GatewayStatus from the PaymentIntent Stripe embeds in the error;
//     amount_too_large, charge_already_refunded (refund) → "amount_exceeds_remaining";
//     an idempotency_error on 400 → "idempotency_key_reused";
//     every other code is passed through as Stripe spells it (e.g. "card_declined").
//   - An HTTP answer stripe-go could not parse (cut short, late past the timeout, a proxy's
//     page) → unknown, whatever its status: its refusal cannot be told from an
//     idempotency_error; but 401 and 403 → not sent.
//   - No HTTP answer at all: if a connection was never obtained (connection refused, DNS
//     failure, a deadline that expired while dialing) nothing was written → not sent. Once a
//     connection was obtained, a timeout, reset or EOF → unknown: the request may have been read
//     and acted upon.
func classify(op string, ci *callInfo, err error) error {
	ge := &payments.GatewayError{Op: op, Err: err}

	var se *stripe.Error
	if errors.As(err, &se) && se.HTTPStatusCode != 0 {
		ge.Err = &apiError{se}
		ge.HTTPStatus = se.HTTPStatusCode
		ge.Code = string(se.Code)
		if ge.Code == "" {
			ge.Code = string(se.Type)
		}
		if pi := se.PaymentIntent; pi != nil && pi.Status != "" {
			ge.GatewayStatus = mapStatus(pi.Status, pi.CancellationReason)
		}
		switch {
		case se.HTTPStatusCode == http.StatusUnauthorized || se.HTTPStatusCode == http.StatusForbidden:
			// Our key was refused: Stripe did nothing, and nothing about the payment was
			// refused (see refgw): retried once the key is right, never a failed payment —
			// whoever said so, Stripe or a proxy's JSON without Stripe's type (a review).
			ge.Kind = payments.FailureNotSent
		case se.HTTPStatusCode >= 500,
			se.HTTPStatusCode == http.StatusTooManyRequests,
			se.HTTPStatusCode == http.StatusConflict,
			se.Code == stripe.ErrorCodeIdempotencyKeyInUse,
			se.Type == stripe.ErrorTypeIdempotency,
			se.Code == stripe.ErrorCodeLockTimeout,
			// A 408 (a proxy gave up waiting for Stripe, which may have the request), or an
			// error object without a type (Stripe always sends one: a proxy's JSON), says
			// nothing of what Stripe did (an outside review: a refund so answered was settled
			// Failed and its amount refunded again; refgw reads them the same).
			se.HTTPStatusCode == http.StatusRequestTimeout,
			se.Type == "":
			ge.Kind = payments.FailureUnknown
		default:
			ge.Kind = payments.FailureDefinitive
		}
		switch {
		case se.HTTPStatusCode == http.StatusNotFound && se.Code == stripe.ErrorCodeResourceMissing,
			// A refund names its PaymentIntent as a parameter, which Stripe refuses with 400 (a
			// path's is 404): the payment is unknown there all the same, and the core's "books
			// differ" case must open (an outside review: it stayed resource_missing).
			op == "refund" && se.Code == stripe.ErrorCodeResourceMissing && se.Param == "payment_intent":
			ge.Code = "not_found"
		case se.Code == stripe.ErrorCodePaymentIntentUnexpectedState && op == "reverse":
			ge.Code = "not_reversible"
		case se.Code == stripe.ErrorCodePaymentIntentUnexpectedState && op == "refund":
			ge.Code = "not_refundable"
		case (se.Code == stripe.ErrorCodeAmountTooLarge || se.Code == stripe.ErrorCodeChargeAlreadyRefunded) && op == "refund":
			ge.Code = "amount_exceeds_remaining"
		case se.Type == stripe.ErrorTypeIdempotency && se.HTTPStatusCode == http.StatusBadRequest:
			ge.Code = "idempotency_key_reused"
		}
		return ge
	}

	if status := int(ci.status.Load()); status != 0 {
		// An answer whose body stripe-go could not read: cut short, arriving after the call's
		// timeout (a slow gateway), or no Stripe error object at all (a proxy's page). Which
		// refusal it was cannot be told — a 400 idempotency_error (an earlier request under our
		// key that Stripe may have carried out) looks the same as a 400 invalid_request_error —
		// and calling it a refusal settled a refund Failed that Stripe may have made, its amount
		// refundable again (an outside review). Unknown, as refgw reads a 4xx that names
		// nothing: asked again with the same key, or looked up. 401 and 403 are our
		// credentials refused, whatever the body: not sent (as above, and as refgw).
		// stripe-go's error for a body it could not decode quotes its first 500 bytes: a
		// PaymentIntent's client_secret and its last_payment_error's card, which must not reach
		// the log or gateway_calls.detail (an outside review). Its context error (the call's
		// time ran out) says nothing of the body and is kept for errors.Is.
		ge.HTTPStatus = status
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			ge.Err = fmt.Errorf("an answer with HTTP status %d that could not be read as Stripe's", status)
		}
		switch status {
		case http.StatusUnauthorized, http.StatusForbidden:
			ge.Kind = payments.FailureNotSent
		default:
			ge.Kind = payments.FailureUnknown
		}
		return ge
	}

	if !ci.gotConn.Load() {
		ge.Kind = payments.FailureNotSent
		return ge
	}
	ge.Kind = payments.FailureUnknown
	return ge
}

// apiError gives a Stripe error object a one-line message. stripe.Error's own Error() is the
// whole object as JSON, including any PaymentIntent embedded in it with its client_secret, which
// must not end up in logs or in the gateway call log. The full object stays reachable through
// errors.As for code that needs it.
type apiError struct{ se *stripe.Error }

func (e *apiError) Error() string {
	s := "stripe " + string(e.se.Type)
	if e.se.Code != "" {
		s += " " + string(e.se.Code)
	}
	if e.se.DeclineCode != "" {
		s += " (" + string(e.se.DeclineCode) + ")"
	}
	if e.se.Msg != "" {
		s += ": " + e.se.Msg
	}
	if e.se.RequestID != "" {
		s += " [" + e.se.RequestID + "]"
	}
	return s
}

func (e *apiError) Unwrap() error { return e.se }
