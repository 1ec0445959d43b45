package payments_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A refund whose answer was lost (pitlane never learnt the gateway's id for it) is flagged, and
// finance settles it Failed by hand. Every path that refunds first looks for such a refund by our
// key on the payment (FindRefund) and is refused while the gateway holds it. An approved
// four-eyes refund proposal ran that look with a Session of ids alone, so FindRefund was asked
// about gateway payment "": on Stripe (stripegw.FindRefund refuses an empty payment id) every
// approval of a refund proposal for that payment failed 503 for good; on a gateway that answers
// the search, nothing was found and the same 500 went out a second time (the customer got 1000
// back, the ledger said 500). From an outside review (refunds); negative control: with the
// Session of ids in ApproveResolution, both subtests fail.
func TestAnApprovedRefundProposalLooksForRefundsFailedByHandOnItsPayment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		stripeLike bool
	}{{"stripe-like search refuses an empty payment id", true}, {"gateway made the lost refund after all", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mod := func(*payments.Config) {}
			if tc.stripeLike {
				mod = func(c *payments.Config) { c.Gateway = paymentIDRequired{c.Gateway} }
			}
			b := newBench(t, shortSchedule, mod)
			ctx := context.Background()
			s := b.completed(t, "o-4e-no-id", 1000)
			b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 4) // the request and the schedule's looks: no answer
			r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k1"})
			if err != nil || r.Refund.Status != payments.RefundPending || r.Refund.GatewayRefundID != "" {
				t.Fatalf("refund = %+v %v", r, err)
			}
			b.runOutRefundSchedule(t)
			p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r.Refund.ID, Outcome: payments.RefundFailed,
				Reason: "nothing in the gateway's dashboard", Evidence: "screenshot FIN-12"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
				t.Fatal(err)
			}
			// No REFUND_DIRECT_LIMIT for EUR: finance's refund is a four-eyes proposal. Its own
			// re-check (RefundByFinance, with the payment as read) finds nothing: right.
			fr, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 500, uuid.NewString()))
			if err != nil || fr.Proposal == nil {
				t.Fatalf("proposal = %+v %v", fr, err)
			}
			if !tc.stripeLike {
				// The lost request reaches the gateway after all (queued, processed late).
				if _, err := b.gw.Refund(ctx, s.GatewayPaymentID, r.Refund.ID, 500, "EUR"); err != nil {
					t.Fatal(err)
				}
			}
			_, err = b.svc.ApproveResolution(ctx, fin2, fr.Proposal.ID)
			t.Logf("approval: %v; find_refund calls on payment %q: %d, in all: %d", err, s.GatewayPaymentID,
				b.gw.PaymentCalls(fakegw.OpFindRefund, s.GatewayPaymentID), b.gw.Calls(fakegw.OpFindRefund))
			if tc.stripeLike {
				if err != nil {
					t.Errorf("approval of a 500 refund proposal on a 1000 payment whose only refund never reached the gateway = %v (%s); want it approved", err, payments.ErrorCode(err))
				}
				return
			}
			if payments.ErrorCode(err) != payments.ECONFLICT {
				t.Errorf("approved refund proposal while the gateway holds the refund settled Failed by hand = %v; want conflict", err)
			}
			if n := b.gw.Refunds(s.GatewayPaymentID); n != 1 {
				t.Errorf("the customer was refunded %d times at the gateway (500 each), want 1; RefundIssued entries in the ledger: %d", n,
					b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1 AND entry_type = 'RefundIssued'`, s.ID))
			}
		})
	}
}

// paymentIDRequired searches refunds like stripegw.FindRefund: an empty payment id is refused
// before anything is sent (invalid_request, definitive).
type paymentIDRequired struct{ payments.Gateway }

func (g paymentIDRequired) FindRefund(ctx context.Context, paymentID, key string) (payments.GatewayRefund, bool, error) {
	if paymentID == "" || key == "" {
		return payments.GatewayRefund{}, false, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: "find_refund",
			Code: "invalid_request", Err: errors.New("payment id and key are required")}
	}
	return g.Gateway.FindRefund(ctx, paymentID, key)
}
