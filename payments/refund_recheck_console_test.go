package payments_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// handFailedRefund: a Completed payment of 1000 whose refund of 500 the gateway knows by id and
// keeps pending until the patrol's schedule runs out; finance settles it Failed by hand (four
// eyes); days later the gateway completes it after all (later: not yet, the gateway says failed).
func (b *bench) handFailedRefund(t *testing.T, order string, later bool) payments.Session {
	t.Helper()
	ctx := context.Background()
	s := b.completed(t, order, 1000)
	b.gw.SetRefundOutcome("pending")
	first, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k1"})
	if err != nil || first.Refund.GatewayRefundID == "" {
		t.Fatalf("refund = %+v %v", first, err)
	}
	b.runOutRefundSchedule(t)
	b.settleByHand(t, first.Refund.ID, fin1, fin2)
	if later {
		b.gw.SetRefundStatus(s.GatewayPaymentID, "failed") // the gateway's word for now
		return s
	}
	b.gw.SetRefundStatus(s.GatewayPaymentID, "succeeded") // days later, after all
	b.gw.SetRefundOutcome("succeeded")
	return s
}

// The promise (refund_settle.go, docs/console.md): after a refund settled Failed by hand, "a new
// refund of the payment first asks the gateway again about each refund settled Failed by hand
// that it knows by id, and is refused while the gateway says it succeeded or is pending". The
// API's CreateRefund does (TestRefundAfterOneFailedByHandAsksTheGatewayAgain); the console's
// refunds — finance's direct refund, support's code-confirmed refund, an approved four-eyes
// refund proposal — claim through claimRefund without the re-check, so the same 500 goes out a
// second time while the gateway says the first one succeeded: the customer gets 1000 back, the
// ledger shows 500. Outside review (money); every subtest fails without the re-check in
// RefundByFinance, ConfirmRefund and ApproveResolution.
func TestConsoleRefundsAskAboutRefundsFailedByHandFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("finance direct refund", func(t *testing.T) {
		b := newBench(t, shortSchedule, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 1000} })
		s := b.handFailedRefund(t, "o-hand-failed-fin", false)
		res, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 500, uuid.NewString()))
		if payments.ErrorCode(err) != payments.ECONFLICT {
			t.Errorf("finance's direct refund while the refund settled Failed by hand succeeded at the gateway = %+v, %v; want conflict", res, err)
		}
		if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
			t.Errorf("refund requests at the gateway = %d, want the first one's 1", n)
		}
	})

	t.Run("support code refund", func(t *testing.T) {
		b := newBench(t, shortSchedule)
		s := b.handFailedRefund(t, "o-hand-failed-sup", false)
		ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 500, uuid.NewString()))
		if err != nil {
			t.Fatalf("code request = %v", err)
		}
		code := b.lastCode(t, s.ID)
		res, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, ch.ID, code)
		if payments.ErrorCode(err) != payments.ECONFLICT {
			t.Errorf("support's confirmed refund while the refund settled Failed by hand succeeded at the gateway = %+v, %v; want conflict", res, err)
		}
		if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
			t.Errorf("refund requests at the gateway = %d, want the first one's 1", n)
		}
	})

	t.Run("four-eyes refund proposal", func(t *testing.T) {
		b := newBench(t, shortSchedule)
		s := b.handFailedRefund(t, "o-hand-failed-4e", true)
		fr, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 500, uuid.NewString()))
		if err != nil || fr.Proposal == nil {
			t.Fatalf("proposal = %+v %v", fr, err)
		}
		b.gw.SetRefundStatus(s.GatewayPaymentID, "succeeded") // before the approval, after all
		b.gw.SetRefundOutcome("succeeded")
		_, err = b.svc.ApproveResolution(ctx, finance2, fr.Proposal.ID)
		if payments.ErrorCode(err) != payments.ECONFLICT {
			t.Errorf("approved refund proposal while the refund settled Failed by hand succeeded at the gateway = %v; want conflict", err)
		}
		if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
			t.Errorf("refund requests at the gateway = %d, want the first one's 1", n)
		}
	})
}
