package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The request that claimed a refund sends it late (its claim answered 15 s late: still inside
// sendFitsGrace), and its replica dies with the refund on the wire (modeled, as in
// TestALateRefundDrivesSendIsNotSentAgainBesideIt, by holding the call): the refund was due at
// its claim's grace, and the patrol sent it again inside the send's: two refunds at a gateway
// that does not honour the key (a review of 32edbf9). A late first send holds the refund first
// (holdLateRefundSend), as a late Create holds its session. Negative control (run by hand):
// without the hold, two refunds.
func TestALateFirstRefundSendIsHeldBeforeItGoes(t *testing.T) {
	t.Parallel()
	late := false
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-late-first-refund", 1000)
	claimedAt := b.clock.Now()
	a := b.service(b.pool, "replica-dies", func(c *payments.Config) {
		c.Hooks.AfterRefundLock = func(ctx context.Context, sessionID string) {
			if !late {
				late = true
				b.clock.Advance(15 * time.Second) // the claim's commit came late; still within sendFitsGrace (20 s)
			}
		}
	})
	b.gw.IgnoreKeys(true)
	send := b.gw.Hold(fakegw.OpRefund)
	done := make(chan error, 1)
	var res payments.RefundResult
	go func() {
		var err error
		res, err = a.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 1000, RequestKey: "k"})
		done <- err
	}()
	mustWait(t, send.Arrived(), "the API's refund at the gateway")
	b.gw.Unhold(fakegw.OpRefund)
	sent := b.clock.Now()
	// A's process is gone with the refund on the wire; the patrol looks once the claim's grace ran out.
	b.clock.Set(claimedAt.Add(payments.StaleAfterFor(0) + time.Second))
	if _, err := b.svc.DriveRefunds(ctx); err != nil {
		t.Fatal(err)
	}
	send.Open()
	if err := mustWait(t, done, "the API's request"); err != nil {
		t.Logf("CreateRefund: %v", err)
	}
	id := res.Refund.ID
	if n := b.gw.Refunds(s.GatewayPaymentID); n != 1 {
		ledger := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND session_id = $1`, s.ID)
		t.Fatalf("%d gateway refunds (%d refund calls for %s, %d RefundIssued rows): the patrol sent it again %s after the API's late send, inside RegisterGrace (%s)",
			n, b.gw.Calls(fakegw.OpRefund), id, ledger, b.clock.Now().Sub(sent), payments.StaleAfterFor(0))
	}
}

// A click's intent is held until locked_until (now + staleAfter), but the click's Create and bind
// go on past it (RecordGrace, a bind written later): an old intent reaped in that window left the
// click that registered its payment answered an error (a review of cabf610). Held within the
// last hour, it is not reaped. Negative control (run by hand): reaped once the hold ran out, the
// error.
func TestAnIntentOfASlowClickIsNotReapedBeforeItsBind(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "o-slow-click", Amount: 1999, Currency: "EUR"}
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
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second) // the click is slower than its hold
	if n, err := b.svc.ReapCheckoutIntents(ctx); err != nil || n != 0 {
		t.Errorf("reaped %d, %v: the click still runs", n, err)
	}
	gate.Open()
	err := mustWait(t, first, "the click's request")
	regs := b.gw.Calls(fakegw.OpRegister)
	if err != nil || res.Session.ID == "" {
		t.Fatalf("the click that registered its payment (%d registrations) was answered %v (session %q)", regs, err, res.Session.ID)
	}
}
