package stripegw

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// A refund answer is translated as Stripe gave it, for the core to compare with what it asked
// (payments.refundAnswerMismatch): one naming no PaymentIntent names no payment (it was filled in
// with the PaymentIntent asked about, and a refund of another charge read as ours), and its
// currency is kept (dropped, 500 JPY read as 5.00 EUR). A review of answers about other things;
// negative control (run by hand): with the old refundOf, pi_ours and no currency.
func TestARefundAnswerIsTranslatedAsStripeGaveIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, answer      string
		payment, currency string
	}{
		{"no PaymentIntent", `{"id":"re_someone_else","object":"refund","amount":500,"currency":"eur","status":"succeeded","payment_intent":null,"metadata":{}}`, "", "EUR"},
		{"another currency", `{"id":"re_1","object":"refund","amount":500,"currency":"jpy","status":"succeeded","payment_intent":"pi_ours","metadata":{"pitlane_refund":"refund-key-1"}}`, "pi_ours", "JPY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, _ := fakeStripe(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, tc.answer)
			})
			gr, err := g.Refund(context.Background(), "pi_ours", "refund-key-1", 500, "EUR")
			if err != nil || gr.PaymentID != tc.payment || gr.Currency != tc.currency {
				t.Fatalf("Refund = %+v %v, want payment %q, currency %s as answered", gr, err, tc.payment, tc.currency)
			}
		})
	}
}
