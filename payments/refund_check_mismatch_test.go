package payments_test

import (
	"context"
	"strings"
	"testing"

	"pitlane/payments"
)

// A payment settled Completed by hand without its gateway id, whose payment the gateway holds
// under its reference for another amount: the refund's Check finds it, opens a gateway_mismatch
// case and records nothing, and nothing is sent. The 409 said the gateway "has not been found
// holding it under its reference" and told the caller to check it and refund again: false, and
// the advice looped (each Check finds the same). It names the contradiction now. A review of
// this session's f0f8d54; negative control: the one "not found" wording, the test fails.
func TestARefundOfAPaymentSettledByHandTheGatewayHoldsForAnotherAmountSaysSo(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s, gp := b.settledByHand(t, "o-hand-other-amount")
	b.gw.SetAmount(gp, 1200, "EUR") // what the gateway holds under the reference
	_, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 300, RequestKey: "k"})
	if payments.ErrorCode(err) != payments.ECONFLICT || b.gw.Refunds(gp) != 0 {
		t.Fatalf("refund = %v (%d sent), want a conflict and nothing sent", err, b.gw.Refunds(gp))
	}
	if kinds := b.openCaseKinds(t, s.ID); !strings.Contains(strings.Join(kinds, ","), payments.CaseGatewayMismatch) {
		t.Fatalf("open cases %v, want a gateway_mismatch case", kinds)
	}
	if msg := payments.ErrorMessage(err); !strings.Contains(msg, "contradicts it") {
		t.Fatalf("the refusal tells the caller the gateway has no payment under the reference, while it holds %s for 1200 (a gateway_mismatch case is open): %q", gp, msg)
	}
}
