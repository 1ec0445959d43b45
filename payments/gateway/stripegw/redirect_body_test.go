package stripegw

import (
	"context"
	"io"
	"net/http"
	"testing"

	"pitlane/payments"
)

// TestARedirectWithAJSONBodyIsUnknownInEveryOp: a 3xx is not followed (TestStripeRefusesRedirects)
// and is the answer, unknown, in every operation, as refgw reads one. stripe-go parses any body
// under 400 as the resource: a 307 whose body was JSON (an API gateway's, an egress proxy's
// {"message":"Temporary Redirect"}) was read as Stripe's answer — FindRefund said "not found"
// (the core's licence to refund again), Refund answered a refund with no id (a review of the
// redirect fix).
func TestARedirectWithAJSONBodyIsUnknownInEveryOp(t *testing.T) {
	t.Parallel()
	g, _ := fakeStripe(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Location", "https://elsewhere.example"+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTemporaryRedirect)
		_, _ = io.WriteString(w, `{"message":"Temporary Redirect"}`)
	})
	ctx := context.Background()
	_, found, ferr := g.FindRefund(ctx, "pi_1", "rf_key")
	rf, rerr := g.Refund(ctx, "pi_1", "rf_key", 500, "EUR")
	rs, serr := g.RefundStatus(ctx, "re_1")
	pis, perr := g.FindByReference(ctx, "ours-42")
	_, sterr := g.Status(ctx, "pi_1")
	for _, c := range []struct {
		op  string
		err error
		got any
	}{{"find_refund", ferr, found}, {"refund", rerr, rf}, {"refund_status", serr, rs}, {"find", perr, pis}, {"status", sterr, nil}} {
		if payments.FailureOf(c.err) != payments.FailureUnknown {
			t.Errorf("%s answered by a 307 with a JSON body: %+v, err %v (kind %q), want unknown", c.op, c.got, c.err, payments.FailureOf(c.err))
		}
	}
}
