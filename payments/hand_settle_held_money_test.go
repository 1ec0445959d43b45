package payments_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The gateway captured 1.00 of a 99.00 payment: the session stays Registered and flagged, a
// gateway_mismatch case names the capture, and the order's checkout is in review (no second
// charge). Finance settles the session Failed by four eyes. The captured money is a late
// payment from then on — as reconciliation would find it — and the order stays in review: the
// approval had let the case's facts go, and a Pay click registered a second payment at the
// gateway while the first one's money was held (an outside review).
func TestASessionSettledFailedWhileTheGatewayHoldsItsMoneyStaysInReview(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-held-settled-failed", 9900)
	b.gw.SetAmount(s.GatewayPaymentID, 100, "EUR")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(ctx, api, s.ID); err != nil {
		t.Fatal(err)
	}
	b.afterMismatch(t, s, payments.StatusRegistered)
	p := b.propose(t, fin1, s.ID, payments.StatusFailed)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.openCaseKinds(t, s.ID); len(got) != 1 || got[0] != payments.CaseLatePayment {
		t.Errorf("open cases = %v, want the late_payment case of the held 1.00", got)
	}
	if in, err := b.svc.PaymentInReview(ctx, s.OrderID); err != nil || !in {
		t.Errorf("in review = %v %v, want true: the gateway holds the order's money", in, err)
	}
	before := b.gw.Calls(fakegw.OpRegister)
	_, err := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: s.OrderID, Amount: 9900, Currency: "EUR"}, 0)
	if !errors.Is(err, payments.ErrPaymentInReview) || b.gw.Calls(fakegw.OpRegister) != before {
		t.Errorf("Pay click = %v with %d new registrations, want ErrPaymentInReview and none", err, b.gw.Calls(fakegw.OpRegister)-before)
	}
	// Reconciliation finds the same money, and it is the same case: no second one.
	b.clock.Advance(60e9)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2`, s.ID, payments.CaseLatePayment); n != 1 {
		t.Errorf("late_payment cases after reconciliation = %d, want 1", n)
	}
}

// The control: a mismatch about money the gateway does not hold (declined, for another amount)
// settled Failed leaves nothing open and the order free to pay again.
func TestASessionSettledFailedWhoseGatewayPaymentHoldsNothingIsFree(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-nothing-held-settled-failed", 9900)
	b.gw.SetAmount(s.GatewayPaymentID, 100, "EUR")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayDeclined)
	if _, err := b.svc.Check(ctx, api, s.ID); err != nil {
		t.Fatal(err)
	}
	b.afterMismatch(t, s, payments.StatusRegistered)
	p := b.propose(t, fin1, s.ID, payments.StatusFailed)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.openCaseKinds(t, s.ID); len(got) != 0 {
		t.Errorf("open cases = %v, want none", got)
	}
	if in, err := b.svc.PaymentInReview(ctx, s.OrderID); err != nil || in {
		t.Errorf("in review = %v %v, want false", in, err)
	}
}

// The gateway's registration answer was a stranger's payment (another reference: never
// attached, a gateway_mismatch case naming it), captured. Settled Failed, the session has no
// money at the gateway: the stranger's payment is not its late payment (reconciliation, which
// searches by the session's reference, never finds it), and the order is free to pay (a review
// of the fix above: it opened a late_payment case about another's money and kept the order in
// review).
func TestASessionSettledFailedIsNotHeldByAStrangersPayment(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	svc := b.service(b.pool, "replica-stranger", func(c *payments.Config) { c.Gateway = strangerGateway{b.gw, payments.GatewaySucceeded} })
	res, err := svc.Create(ctx, api, payments.CreateInput{OrderID: "o-stranger-settled", Amount: 1999, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.plain.Get(ctx, res.Session.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.afterMismatch(t, s, s.Status)
	p := b.propose(t, fin1, s.ID, payments.StatusFailed)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.openCaseKinds(t, s.ID); len(got) != 0 {
		t.Errorf("open cases = %v, want none: the stranger's payment is not this session's money", got)
	}
	if in, err := b.svc.PaymentInReview(ctx, s.OrderID); err != nil || in {
		t.Errorf("in review = %v %v, want false", in, err)
	}
}
