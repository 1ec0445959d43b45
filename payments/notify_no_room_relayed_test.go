package payments_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"pitlane/payments"
)

// TestARelayedRefundCodeSurvivesAWaitingProposal: without a notifier the outbox is the
// channel admins relay codes from; every code's message stays undelivered, unleased and in
// clear. Support asks for a 7.00 refund code on a 10.00 payment; an admin reads it in the
// outbox and tells the customer. Finance meanwhile proposes a 5.00 refund (it waits for a
// second person and holds 5.00 of the room: the code's 7.00 no longer fits). The proposal is
// rejected: the room is back and the customer's code is good again. If the housekeeping ran
// while the proposal waited, RedactDeadCodes took the relayed message for an "unsent" no_room
// code and superseded its challenge: the code the customer held was dead (a review of the shared
// list of dead codes). No room counts as dead in the housekeeping only for a message a notifier
// has tried (TestARefundCodeWithNoRoomStopsCountingAsFailing).
func TestARelayedRefundCodeSurvivesAWaitingProposal(t *testing.T) {
	t.Parallel()
	for _, housekeeping := range []bool{false, true} {
		name := "no housekeeping while the proposal waits"
		if housekeeping {
			name = "housekeeping while the proposal waits"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t) // no Notifier: admins relay codes from the outbox
			ctx := context.Background()
			paid := b.completed(t, "o-probe-relay-"+uuid.NewString()[:8], 1000)
			ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(paid.ID, 700, uuid.NewString()))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.svc.Outbox(ctx, payments.Staff{Email: "admin@example.com", Role: "admin"}, paid.ID); err != nil {
				t.Fatal(err) // the admin reads the code and relays it to the customer
			}
			code := b.lastCode(t, paid.ID)
			fr, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(paid.ID, 500, uuid.NewString()))
			if err != nil || fr.Proposal == nil {
				t.Fatalf("finance's proposal = %+v %v", fr, err)
			}
			if housekeeping {
				if _, err := b.svc.RedactDeadCodes(ctx, b.clock.Now(), 0); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.svc.RejectResolution(ctx, fin2, fr.Proposal.ID, "duplicate of the support refund"); err != nil {
				t.Fatal(err)
			}
			res, err := b.svc.ConfirmRefund(ctx, supportStaff, paid.ID, ch.ID, code)
			if err != nil || res.Refund.Amount != 700 {
				t.Fatalf("the customer's relayed code, read out after the proposal was rejected (room back) = %+v %v (%s); want the 7.00 refund",
					res.Refund, err, payments.ErrorCode(err))
			}
		})
	}
}
