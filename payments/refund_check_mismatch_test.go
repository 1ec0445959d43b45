package payments_test

import (
	"context"
	"strings"
	"testing"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
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
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	r0, err := b.plain.Create(ctx, api, payments.CreateInput{OrderID: "o-hand-other-amount", Amount: 1000, Currency: "EUR"})
	if err != nil || r0.Session.GatewayPaymentID != "" {
		t.Fatalf("setup: %+v %v", r0.Session, err)
	}
	gp := "gp_fake_1"
	b.gw.SetStatus(gp, payments.GatewaySucceeded)
	b.gw.SetAmount(gp, 1200, "EUR")
	p := b.propose(t, fin1, r0.Session.ID, payments.StatusCompleted)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	_, err = b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: r0.Session.ID, Amount: 300, RequestKey: "k"})
	if payments.ErrorCode(err) != payments.ECONFLICT || b.gw.Refunds(gp) != 0 {
		t.Fatalf("refund = %v (%d sent), want a conflict and nothing sent", err, b.gw.Refunds(gp))
	}
	if kinds := b.openCaseKinds(t, r0.Session.ID); !strings.Contains(strings.Join(kinds, ","), payments.CaseGatewayMismatch) {
		t.Fatalf("open cases %v, want a gateway_mismatch case", kinds)
	}
	if msg := payments.ErrorMessage(err); !strings.Contains(msg, "contradicts it") {
		t.Fatalf("the refusal tells the caller the gateway has no payment under the reference, while it holds %s for 1200 (a gateway_mismatch case is open): %q", gp, msg)
	}
}
