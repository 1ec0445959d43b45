package payments_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"pitlane/payments"
)

// TestARelayedCodeOfAFailingMessageSurvivesAWaitingProposal: the same flow as
// TestARelayedRefundCodeSurvivesAWaitingProposal, but with NOTIFY_WEBHOOK_URL set and failing:
// undelivered codes ("no NOTIFY_WEBHOOK_URL, or delivery failing", docs/console.md) stay readable
// in the outbox for admins to relay. The admin relays the code; finance's proposal holds the room;
// the housekeeping runs, and the outbox's next try; the proposal is rejected; the customer reads
// the code out. Both superseded it as having no room (a review of the rule): a code someone read
// in the outbox is never dead for want of room.
func TestARelayedCodeOfAFailingMessageSurvivesAWaitingProposal(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	paid := b.completed(t, "o-probe-relay-failing-"+uuid.NewString()[:8], 1000)
	ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, uuid.NewString()))
	if err != nil || ch.Undelivered == "" {
		t.Fatalf("setup: %+v %v, want a code whose delivery failed", ch, err)
	}
	if _, err := b.svc.Outbox(ctx, payments.Staff{Email: "admin@example.com", Role: "admin"}, paid.ID); err != nil {
		t.Fatal(err) // the admin reads the code and relays it to the customer
	}
	if seen := b.count(t, `SELECT count(*) FROM cancel_challenges WHERE id = $1 AND cardinality(seen_by) > 0`, ch.ID); seen != 1 {
		t.Fatalf("setup: the outbox read is not recorded on the challenge (%d)", seen)
	}
	code := b.lastCode(t, paid.ID)
	fr, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(paid.ID, 500, uuid.NewString()))
	if err != nil || fr.Proposal == nil {
		t.Fatalf("finance's proposal = %+v %v", fr, err)
	}
	if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(2 * 60e9) // the failing message's next try, the proposal still waiting
	if _, err := b.svc.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.RejectResolution(ctx, fin2, fr.Proposal.ID, "duplicate of the support refund"); err != nil {
		t.Fatal(err)
	}
	res, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, ch.ID, code)
	if err != nil || res.Refund.Amount != 700 {
		t.Fatalf("the customer's relayed code (its message's delivery failing), read out after the proposal was rejected (room back) = %+v %v (%s); want the 7.00 refund",
			res.Refund, err, payments.ErrorCode(err))
	}
}
