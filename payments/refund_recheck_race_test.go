package payments_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The re-check of refunds settled Failed by hand (recheckRefundsFailedByHand) waits for the
// gateway outside the order → session locks. A second person approving another refund's Failed
// outcome in that gap used to free its amount with nobody asking the gateway about it: the
// claim that followed saw the room and sent the same money again, though the gateway still had
// that refund pending. Now the claim, under the locks, sees a refund settled Failed by hand that
// the re-check did not ask about and asks again, and the new refund is refused (409) with the
// second refund's case for finance. Outside review (money); each subtest fails without the look
// in claimRefund (settledMeanwhile).
func TestARefundSettledFailedDuringTheRecheckIsAskedAboutBeforeTheClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	paths := []struct {
		name   string
		refund func(b *bench, s payments.Session) error
	}{
		{"API refund", func(b *bench, s payments.Session) error {
			_, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 600, RequestKey: "k-new"})
			return err
		}},
		{"finance direct refund", func(b *bench, s payments.Session) error {
			_, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 600, uuid.NewString()))
			return err
		}},
	}
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t, shortSchedule, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 1000} })
			s := b.completed(t, "o-recheck-race", 1000)

			// R0 (400): pending until its schedule ran out, settled Failed by hand; the gateway agrees.
			b.gw.SetRefundOutcome("pending")
			r0, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "k0"})
			if err != nil {
				t.Fatal(err)
			}
			b.runOutRefundSchedule(t)
			b.settleByHand(t, r0.Refund.ID, fin1, fin2)
			b.gw.SetRefundStatus(s.GatewayPaymentID, "failed")

			// R1 (600): pending at the gateway for good, flagged; its Failed outcome proposed.
			r1, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 600, RequestKey: "k1"})
			if err != nil || r1.Refund.GatewayRefundID == "" {
				t.Fatalf("R1 = %+v %v", r1, err)
			}
			b.runOutRefundSchedule(t)
			p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r1.Refund.ID, Outcome: payments.RefundFailed,
				Reason: "looks never executed", Evidence: "ticket GW-91"})
			if err != nil {
				t.Fatal(err)
			}
			sent := b.gw.Calls(fakegw.OpRefund)

			// The new refund of 600 asks about R0 — and while the gateway takes its time, R1's
			// Failed outcome is approved.
			gate := b.gw.Hold(fakegw.OpRefundStatus)
			defer gate.Open()
			done := make(chan error, 1)
			go func() { done <- path.refund(b, s) }()
			mustWait(t, gate.Arrived(), "the re-check's look at R0")
			if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
				t.Fatal(err)
			}
			gate.Open()
			if err := <-done; payments.ErrorCode(err) != payments.ECONFLICT {
				t.Errorf("the new refund of 600 while R1 is still pending at the gateway = %v; want conflict", err)
			}
			if n := b.gw.Calls(fakegw.OpRefund) - sent; n != 0 {
				t.Errorf("refund requests at the gateway after R1 = %d, want 0 (the customer would get 600 twice)", n)
			}
			if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL
				AND detail LIKE '%' || $3 || '%'`, s.ID, payments.CaseGatewayMismatch, r1.Refund.ID); n != 1 {
				t.Errorf("open gateway_mismatch cases naming R1 = %d, want 1", n)
			}
		})
	}
}

// settleByHand settles a flagged refund Failed with four eyes.
func (b *bench) settleByHand(t *testing.T, refundID string, proposer, approver payments.Staff) {
	t.Helper()
	ctx := context.Background()
	p, err := b.svc.ProposeRefundOutcome(ctx, proposer, payments.RefundOutcomeInput{RefundID: refundID, Outcome: payments.RefundFailed,
		Reason: "the gateway's support: never executed", Evidence: "ticket GW-78"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ApproveResolution(ctx, approver, p.ID); err != nil {
		t.Fatal(err)
	}
}
