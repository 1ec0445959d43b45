package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A Pay click whose intent row is older than CheckoutIntentRetention (its first Create let the
// key go; the same form submitted again 30 days later took it back) was reaped while its Create
// was at the gateway: the click that made and registered its payment was answered "no such
// payment attempt" (a review of late sends). Nor once the click ran past its hold (its Create and
// bind go on past it: RecordGrace, a bind written later; a review of that fix): an intent held
// within the last hour is not reaped. Negative controls (run by hand): reaped by age alone, and
// once the hold ran out, the error.
func TestAnIntentInFlightIsNotReapedUnderItsClick(t *testing.T) {
	t.Parallel()
	for _, past := range []time.Duration{0, payments.StaleAfterFor(0) + time.Second} {
		b := newBench(t)
		ctx := context.Background()
		key := uuid.NewString()
		in := payments.CreateInput{OrderID: "o-reaped-click", Amount: 1999, Currency: "EUR"}
		if _, err := b.pool.Exec(ctx, `INSERT INTO checkout_intents (key, order_id, amount, currency, created_at) VALUES ($1, $2, $3, $4, $5)`,
			key, in.OrderID, in.Amount, in.Currency, b.clock.Now().Add(-payments.CheckoutIntentRetention-time.Hour)); err != nil {
			t.Fatal(err)
		}
		gate := b.gw.Hold(fakegw.OpRegister)
		first := make(chan error, 1)
		var res payments.CheckoutPayResult
		go func() {
			var err error
			res, err = b.svc.CheckoutPay(ctx, key, in, 0)
			first <- err
		}()
		mustWait(t, gate.Arrived(), "the click's registration at the gateway")
		b.clock.Advance(past) // the click is slower than its hold
		if n, err := b.svc.ReapCheckoutIntents(ctx); err != nil || n != 0 {
			t.Errorf("%s past the click's start: reaped %d, %v; the click still runs", past, n, err)
		}
		gate.Open()
		err := mustWait(t, first, "the click's request")
		regs, sess := b.gw.Calls(fakegw.OpRegister), b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, in.OrderID)
		if err != nil || res.Session.ID == "" {
			t.Fatalf("%s past its start, the click that made and registered its payment (%d registrations, %d sessions) was answered %v (session %q)",
				past, regs, sess, err, res.Session.ID)
		}
	}
}
