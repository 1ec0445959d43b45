package payments_test

import (
	"context"
	"strings"
	"testing"

	"pitlane/payments"
)

// refundFailedByHand is a payment of 10.00 and its refund of amount, left pending by the
// gateway until its schedule ran out, then settled Failed by four eyes (fin1, fin2).
func (b *bench) refundFailedByHand(t *testing.T, orderID string, amount int64) (payments.Session, payments.Refund) {
	t.Helper()
	s := b.completed(t, orderID, 1000)
	b.gw.SetRefundOutcome("pending")
	first, err := b.svc.CreateRefund(context.Background(), api, payments.RefundInput{PaymentID: s.ID, Amount: amount, RequestKey: "k1"})
	if err != nil || first.Refund.GatewayRefundID == "" {
		t.Fatalf("refund = %+v %v", first, err)
	}
	b.runOutRefundSchedule(t)
	b.settleByHand(t, first.Refund.ID, fin1, fin2)
	return s, first.Refund
}

// handFailedThenPaid is a payment of 10.00 whose 5.00 refund finance settled Failed by four
// eyes, and which the gateway paid after all: the next refund learns it (refused, the gateway's
// word noted on a gateway_mismatch case), and finance resolves that case.
func (b *bench) handFailedThenPaid(t *testing.T, orderID string) (payments.Session, payments.Refund) {
	t.Helper()
	ctx := context.Background()
	s, firstRefund := b.refundFailedByHand(t, orderID, 500)
	first := payments.RefundResult{Refund: firstRefund}
	b.gw.SetRefundStatus(s.GatewayPaymentID, "succeeded") // paid after all, days late
	b.gw.SetRefundOutcome("succeeded")
	_, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k2"})
	if payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(err.Error(), "marks it Succeeded") {
		t.Fatalf("a refund beside one the gateway paid = %v, want the conflict saying what to do", err)
	}
	b.resolveOpenCase(t, s.ID, payments.CaseGatewayMismatch, "confirmed with the gateway: refund paid on day 3")
	r, err := b.svc.GetRefund(ctx, first.Refund.ID)
	if err != nil || !r.FailedByHand() || !r.SettleableByHand() {
		t.Fatalf("setup: %+v %v", r, err)
	}
	return s, r
}

// A refund settled Failed by hand that the gateway paid after all is corrected to Succeeded by
// four eyes: its RefundIssued entry is written (the books had it short for good), and a later
// refund within what is really left goes through (every one was refused for good, naming a case
// no longer open; an outside review). Only Succeeded is a correction; the room still holds.
// Negative control (run by hand): with the proposal refusing a Failed refund as before, the
// correction is refused and the 1.00 refund after it too.
func TestARefundFailedByHandThatTheGatewayPaidIsCorrectedToSucceeded(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s, r := b.handFailedThenPaid(t, "o-hand-failed-paid")
	if _, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r.ID, Outcome: payments.RefundFailed,
		Reason: "x", Evidence: "y"}); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("Failed again = %v, want invalid: only Succeeded corrects it", err)
	}
	p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r.ID, Outcome: payments.RefundSucceeded,
		Reason: "the gateway paid it on day 3", Evidence: "gateway dashboard, refund " + r.GatewayRefundID})
	if err != nil || p.What() != "refund "+r.ID[:8]+" Failed → Succeeded" {
		t.Fatalf("proposal = %q %v", p.What(), err)
	}
	// Waiting, it is not taken for a proposal the refund outran (it is Failed, not Pending):
	// another proposal is refused, not filed over it.
	if _, err := b.svc.ProposeRefundOutcome(ctx, fin2, payments.RefundOutcomeInput{RefundID: r.ID, Outcome: payments.RefundSucceeded,
		Reason: "same", Evidence: "same"}); payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(err.Error(), "already waits") {
		t.Fatalf("a second proposal while the correction waits = %v, want conflict", err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	got, err := b.svc.GetRefund(ctx, r.ID)
	if err != nil || got.Status != payments.RefundSucceeded {
		t.Fatalf("after the correction: %+v %v", got, err)
	}
	for sql, want := range map[string]int{
		`SELECT count(*) FROM accounting_entries WHERE refund_id = $1 AND entry_type = 'RefundIssued' AND amount = 500`:                           1,
		`SELECT count(*) FROM refund_events WHERE refund_id = $1 AND from_status = 'Failed' AND to_status = 'Succeeded' AND actor_kind = 'staff'`: 1,
		`SELECT count(*) FROM audit_log WHERE action = 'resolution.propose' AND detail LIKE '%' || $1 || ' Failed → Succeeded%'`:                  1,
	} {
		if n := b.count(t, sql, r.ID); n != want {
			t.Errorf("%s = %d, want %d", sql, n, want)
		}
	}
	if _, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 600, RequestKey: "k3"}); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Errorf("6.00 of the 5.00 left = %v, want conflict", err)
	}
	again, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 100, RequestKey: "k4"})
	if err != nil || again.Refund.Status != payments.RefundSucceeded {
		t.Errorf("1.00 of the 5.00 left = %+v %v, want it refunded", again, err)
	}
}

// A correction whose room was taken meanwhile is refused at approval, and nothing is written:
// the books never show more refunded than the payment received.
func TestACorrectionToSucceededNeedsTheRoomItTakes(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s, r := b.handFailedThenPaid(t, "o-hand-failed-paid-room")
	p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r.ID, Outcome: payments.RefundSucceeded,
		Reason: "the gateway paid it", Evidence: "dashboard"})
	if err != nil {
		t.Fatal(err)
	}
	// Meanwhile 8.00 went out by another refund, written as the database's data fix would
	// (nothing in pitlane refunds beside a refund the gateway says it paid).
	if _, err := b.pool.Exec(ctx, `INSERT INTO refunds (id, session_id, order_id, amount, currency, status, detail, request_key, created_by, created_at, updated_at)
		SELECT gen_random_uuid(), id, order_id, 800, currency, 'Succeeded', 'data fix', 'fix-1', 'staff:ops', now(), now() FROM payment_sessions WHERE id = $1`, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("approval = %v, want conflict", err)
	}
	if got, _ := b.svc.GetRefund(ctx, r.ID); got.Status != payments.RefundFailed {
		t.Errorf("refund = %s, want Failed still", got.Status)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE refund_id = $1`, r.ID); n != 0 {
		t.Errorf("ledger entries = %d, want 0", n)
	}
}
