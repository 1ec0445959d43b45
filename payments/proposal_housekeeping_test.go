package payments_test

import (
	"context"
	"testing"

	"pitlane/payments"
)

// TestHousekeepingWithdrawsAProposalTheDisableSkipped: the disable's withdrawal skips a proposal
// a decision holds (SKIP LOCKED); the enable withdraws it again
// (TestEnableWithdrawsAProposalTheDisableSkipped), but an offboarding for good is never followed
// by an enable: the skipped proposal stayed 'proposed' and kept blocking the payment
// (RetryFlagged refused: "waits for a second person: approve or reject it first"), though no
// one could approve it (an outside review, SKIP LOCKED leftovers). The housekeeping withdraws it.
func TestHousekeepingWithdrawsAProposalTheDisableSkipped(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	_, _, s, p := proposalTheDisableSkipped(t, b, "o-probe-skipped-forever")
	// fin1 is gone for good; the housekeeping runs.
	if n, err := b.svc.WithdrawProposalsOfDisabled(ctx); err != nil || n != 1 {
		t.Fatalf("housekeeping withdrew %d, %v; want the skipped proposal", n, err)
	}
	_, rerr := b.svc.RetryFlagged(ctx, fin2, s.ID)
	if got := b.texts(t, `SELECT state FROM resolution_proposals WHERE id = $1`, p.ID); len(got) != 1 || got[0] != "rejected" || rerr != nil {
		t.Errorf("proposal #%d of disabled %s after the housekeeping: %v, want rejected (withdrawn); RetryFlagged by %s: %v",
			p.ID, fin1.Email, got, fin2.Email, rerr)
	}
	if got := b.count(t, `SELECT count(*) FROM audit_log WHERE actor = 'system:housekeeping' AND action = $1 AND target = $2`, payments.AuditResolutionReject, s.ID); got != 1 {
		t.Errorf("%d audit entries for the withdrawal, want 1", got)
	}
	if n, err := b.svc.WithdrawProposalsOfDisabled(ctx); err != nil || n != 0 {
		t.Errorf("a second housekeeping withdrew %d, %v", n, err)
	}
}
