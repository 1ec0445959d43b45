package stripegw

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	"pitlane/payments"
)

// Stripe documents HTTP 409 as "the request conflicts with another request (perhaps due to
// using the same idempotent key)": another request under our key is running at Stripe and may
// still create the refund or the PaymentIntent. classify called a 409 unknown only when its body
// parsed and carried code=idempotency_key_in_use; one naming only the type (Stripe's older body:
// "There is currently another in-progress request using this Idempotent Key") or cut short was a
// definitive refusal, and the core settled such a refund Failed — no RefundIssued entry, its
// amount refundable again — while Stripe made it. Outside review (gateway adapters); fails with
// the 409 judged by its code.
func TestAny409IsNotARefusal(t *testing.T) {
	t.Parallel()
	const inProgress = `{"error":{"type":"idempotency_error","message":"There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): k1. Please try again later."}}`
	cases := []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"409 in-progress body without a code", stripeError(http.StatusConflict, inProgress)},
		{"409 whose body was cut short", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(inProgress)))
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, inProgress[:40]) // the connection ends before the rest
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, _ := fakeStripe(t, tc.handler)
			ge := gatewayError(t, refund(g))
			if ge.Kind != payments.FailureUnknown {
				t.Fatalf("refund answered HTTP 409 (another request under our key is in progress) classified %s (code %q): %v; "+
					"want unknown — the core settles a definitive refund refusal Failed while Stripe may still make the refund", ge.Kind, ge.Code, ge)
			}
		})
	}
}
