package stripegw

import (
	"testing"

	"pitlane/payments"
)

// What Stripe cannot be asked for is refused before anything is sent: half an ariary, a
// three-decimal amount whose last digit is not 0 (Stripe's rule). An amount Stripe reports that
// is not a whole number of the core's units (a fractional-króna charge) can match no session.
func TestStripeUnits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		amount   int64
		currency string
	}{{1050, "MGA"}, {1, "MGA"}, {1255, "KWD"}, {1001, "BHD"}} {
		_, err := toStripe("register", tc.amount, tc.currency)
		if ge, ok := err.(*payments.GatewayError); !ok || ge.Kind != payments.FailureDefinitive || ge.Code != "invalid_request" {
			t.Errorf("%d %s: %v, want a local invalid_request", tc.amount, tc.currency, err)
		}
	}
	for _, tc := range []struct {
		stripe   int64
		currency string
		core     int64
	}{{500000, "ISK", 5000}, {4010, "ISK", -1}, {100000000, "UGX", 1000000}, {150, "UGX", -1}, {10, "MGA", 1000}, {1250, "KWD", 1250}, {500, "JPY", 500}, {1999, "EUR", 1999}} {
		if got := fromStripe(tc.stripe, tc.currency); got != tc.core {
			t.Errorf("fromStripe(%d %s) = %d, want %d", tc.stripe, tc.currency, got, tc.core)
		}
	}
}
