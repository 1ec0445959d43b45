package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A patrol drive's refund request is answered after its lease ran out. Meanwhile another replica
// took the refund over, got no answer at its last look and flagged it; finance settled it Failed
// by hand with four eyes (the gateway had nothing yet). Then the first request lands at the
// gateway and the customer is refunded. The late drive has lost its lease, so it writes no
// outcome — but the gateway's word contradicts the one settled meanwhile: it opens a
// gateway_mismatch case (never dropped in silence) and keeps the gateway's refund id on the row,
// so the next refund of the same amount asks the gateway about this one first and is refused
// instead of refunding the customer twice. Outside review (lease); fails without the fix in
// driveRefund's apply (a lost lease returned before the contradiction was looked at).
//
// The gateway may take the late request as "pending" (it will pay it) rather than "succeeded":
// against a refund settled Failed that is the same contradiction, and it was dropped in silence —
// no id kept, no case, and the same amount refunded again (an outside review, money; negative
// control: the pending answer not counted as a contradiction, the pending subtest fails).
func TestLateRefundAnswerAfterTheLeaseRanOutStillReachesFinance(t *testing.T) {
	t.Parallel()
	for _, answer := range []string{"succeeded", "pending"} {
		t.Run(answer, func(t *testing.T) {
			t.Parallel()
			b, other := twoReplicasMinuteLease(t)
			ctx := context.Background()
			s := b.completed(t, "o-review-lease-refund-"+answer, 1000)

			// The request's own send and the schedule's first two looks get no answer (nothing processed).
			b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 3)
			r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k"})
			if err != nil || r.Refund.Status != payments.RefundPending {
				t.Fatalf("refund = %+v %v", r, err)
			}
			b.clock.Advance(payments.StaleAfterFor(0))
			for range 2 {
				if _, err := b.svc.DriveRefunds(ctx); err != nil {
					t.Fatal(err)
				}
				b.clock.Advance(time.Second)
			}
			if n := b.count(t, `SELECT check_attempts FROM refunds WHERE id = $1`, r.Refund.ID); n != 2 {
				t.Fatalf("setup: check_attempts = %d", n)
			}

			// Replica A's last look: its refund request is slow at the gateway.
			gate := b.gw.Hold(fakegw.OpRefund)
			defer gate.Open()
			doneA := make(chan struct{})
			go func() { _, _ = b.svc.DriveRefunds(ctx); close(doneA) }()
			mustWait(t, gate.Arrived(), "A's refund request")
			b.gw.Unhold(fakegw.OpRefund)

			// A's lease runs out; replica B takes the refund over, gets no answer, and its release flags it.
			b.clock.Advance(time.Minute + time.Second)
			b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1)
			if n, err := other.DriveRefunds(ctx); err != nil || n != 1 {
				t.Fatalf("B drove %d: %v", n, err)
			}
			got, _ := b.svc.GetRefund(ctx, r.Refund.ID)
			if got.FlaggedAt == nil || got.Status != payments.RefundPending {
				t.Fatalf("setup: after B's look the refund is %+v, want Pending and flagged", got)
			}

			// Finance settles it Failed by hand, four eyes (the gateway has no refund yet).
			p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r.Refund.ID, Outcome: payments.RefundFailed,
				Reason: "the gateway has no refund under our key", Evidence: "gateway dashboard: no refund"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
				t.Fatal(err)
			}

			// A's request lands: the gateway refunds the customer (or takes the refund to pay it);
			// A finds its lease lost.
			b.gw.SetRefundOutcome(answer)
			gate.Open()
			mustWait(t, doneA, "A's round")
			if n := b.gw.Refunds(s.GatewayPaymentID); n != 1 {
				t.Fatalf("setup: gateway refunds = %d, want 1", n)
			}
			got, _ = b.svc.GetRefund(ctx, r.Refund.ID)
			if got.Status != payments.RefundFailed || got.GatewayRefundID == "" {
				t.Errorf("after A's late answer the refund is %s with gateway id %q: want Failed as settled, with the gateway's id kept", got.Status, got.GatewayRefundID)
			}
			if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL`,
				s.ID, payments.CaseGatewayMismatch); n != 1 {
				t.Errorf("open gateway_mismatch cases = %d, want 1: the gateway refunded a refund settled Failed here", n)
			}

			// The same 5.00 again: the gateway is asked about the refund settled by hand and the new one is refused.
			_, err = b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k2"})
			if payments.ErrorCode(err) != payments.ECONFLICT {
				t.Errorf("second refund of the same 5.00: err %v, want a conflict", err)
			}
			if n := b.gw.Refunds(s.GatewayPaymentID); n != 1 {
				t.Errorf("the customer was refunded %d times at the gateway, want 1", n)
			}
			if n := b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1`, s.ID); n != 1 {
				t.Errorf("refund rows = %d, want 1 (the refused one claims nothing)", n)
			}
		})
	}
}
