package payments_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A CI day (the third, seed 2) ended with "gateway refund rf_fake_12 (succeeded, 400 of
// gp_fake_11) has 0 refund rows": the shop's refund was processed with its answer lost, and each
// look of the schedule (four steps on that day) got no answer either, so the row was flagged
// Pending without the gateway's id — finance's to settle, by design: the flagged list shows it,
// the gateway finds it by our key, and Retry now settles it (a review traced every path that
// writes the id; none drops an answer). chaosInvariants now takes a Pending row without an id
// whose key made the gateway refund as its row; a row that ended otherwise is still a finding.
// Negative control: the row Failed (as a bug would leave it) is reported.
func TestChaosInvariantsTakeAFlaggedRefundWithoutItsIDAsItsRow(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) {
		c.Backoff = []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 3 * time.Hour}
	})
	ctx := context.Background()
	s := b.completed(t, "o-flagged-refund", 1000)
	b.gw.Fail(fakegw.OpRefund, fakegw.LostAnswer, 1) // the shop's request: made, answer lost
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 4)  // every look of the schedule: 503
	r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "shop-1"})
	if err != nil || r.Refund.Status != payments.RefundPending {
		t.Fatalf("refund = %+v %v", r, err)
	}
	for range 8 {
		b.clock.Advance(4 * time.Hour)
		if _, err := b.svc.DriveRefunds(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.svc.GetRefund(ctx, r.Refund.ID)
	if err != nil || got.Status != payments.RefundPending || got.FlaggedAt == nil || got.GatewayRefundID != "" || b.gw.Refunds(s.GatewayPaymentID) != 1 {
		t.Fatalf("want Pending, flagged, no gateway id beside one gateway refund: %+v %v (%d gateway refunds)", got, err, b.gw.Refunds(s.GatewayPaymentID))
	}
	for _, m := range chaosInvariants(t, b) {
		t.Errorf("flagged without its id: %s", m)
	}

	// The same row Failed (and back as it was): the gateway's refund has no row.
	if _, err := b.pool.Exec(ctx, `UPDATE refunds SET status = 'Failed' WHERE id = $1`, got.ID); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range chaosInvariants(t, b) {
		found = found || strings.Contains(m, "has 0 refund rows")
	}
	if !found {
		t.Error("a Failed row whose request made a paid gateway refund is no finding")
	}
	if _, err := b.pool.Exec(ctx, `UPDATE refunds SET status = 'Pending' WHERE id = $1`, got.ID); err != nil {
		t.Fatal(err)
	}

	// Finance's way: Retry now, and the patrol records the gateway's refund by the key.
	if _, err := b.svc.RetryFlaggedRefund(ctx, payments.Staff{Email: "fin@example.com", Role: "finance"}, got.ID); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	if _, err := b.svc.DriveRefunds(ctx); err != nil {
		t.Fatal(err)
	}
	if after, err := b.svc.GetRefund(ctx, got.ID); err != nil || after.Status != payments.RefundSucceeded || after.GatewayRefundID == "" {
		t.Fatalf("after Retry now: %+v %v", after, err)
	}
	for _, m := range chaosInvariants(t, b) {
		t.Errorf("after Retry now: %s", m)
	}
}
