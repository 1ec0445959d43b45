package payments_test

import (
	"context"
	"testing"

	"pitlane/payments"
)

// fin1 proposes Completed for a flagged payment of 99.00; after the proposal a Check learns the
// gateway captured 1.00 of it (a gateway_mismatch case opens; the payment stays Registered and
// flagged). fin2's approval compared the status alone: it booked 99.00 received and closed the
// case nobody on the proposal was shown, its facts let go (an outside review, console actions
// under concurrency). Refused now, nothing settled; a case resolved meanwhile is no news.
// Negative control (run by hand): without newsSinceProposal, Completed and a 99.00 entry.
func TestAnApprovalAfterNewsSinceTheProposalIsRefused(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.flagged(t, "o-news-after-proposal", 9900)
	p := b.propose(t, fin1, s.ID, payments.StatusCompleted)
	b.capturedAtAnotherAmount(t, s, 100, payments.GatewaySucceeded) // news after the proposal
	_, err := b.svc.ApproveResolution(ctx, fin2, p.ID)
	if payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("approval after news since the proposal = %v, want a conflict", err)
	}
	t.Logf("refused: %v", err)
	got, err := b.svc.Get(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != payments.StatusRegistered || got.FlaggedAt == nil {
		t.Errorf("payment %s flagged=%v, want Registered and flagged (nothing settled)", got.Status, got.FlaggedAt != nil)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = $1`, s.OrderID); n != 0 {
		t.Errorf("%d ledger entries, want none", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, s.ID); n != 2 {
		t.Errorf("%d open cases, want 2 (the schedule's and the mismatch)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state = 'proposed'`, p.ID); n != 1 {
		t.Errorf("the proposal is no longer waiting (%d)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = 'resolution.approve'`); n != 0 {
		t.Errorf("%d approval audits, want none", n)
	}

	// Control: a proposal made knowing the mismatch, and a case resolved after it, approve.
	if _, err := b.svc.RejectResolution(ctx, fin2, p.ID, "news since: proposing again"); err != nil {
		t.Fatal(err)
	}
	p2 := b.propose(t, fin1, s.ID, payments.StatusFailed)
	b.exec(t, `UPDATE finance_cases SET resolved_at = now(), resolved_by = 'fin3', resolution = 'x' WHERE session_id = $1 AND kind = 'sweep_exhausted'`, s.ID)
	if _, err := b.svc.ApproveResolution(ctx, fin2, p2.ID); err != nil {
		t.Fatalf("approval of a proposal that knew every open case = %v", err)
	}
}

// The proposal remembered the cases as they were when it committed, not as the proposer's form
// showed them: a capture of 1.00 found while the proposer typed (the status unchanged, so the
// form's seen passed) counted as seen, and proposal and approval both went through (a review).
// The form carries the gateway's word it showed (SettleCandidate.CasesSeen); news since is
// refused, nothing proposed. Negative control (run by hand): without the comparison, proposed.
func TestACaseOpenedWhileTheProposerTypesRefusesTheProposal(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.flagged(t, "o-news-while-typing", 9900)
	form, err := b.svc.SettleCandidate(ctx, s.ID) // the proposer's form, rendered
	if err != nil {
		t.Fatal(err)
	}
	b.capturedAtAnotherAmount(t, s, 100, payments.GatewaySucceeded) // news while the proposer types
	in := payments.ProposalInput{SessionID: s.ID, Outcome: payments.StatusCompleted, Reason: "the customer's bank shows the charge",
		Evidence: "gateway dashboard", Seen: form.Session.Status, CasesSeen: form.CasesSeen}
	if _, err := b.svc.ProposeResolution(ctx, fin1, in); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("a proposal from a form read before the gateway's news = %v, want a conflict", err)
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE session_id = $1`, s.ID); n != 0 {
		t.Fatalf("%d proposals, want none", n)
	}
	// The form read again shows the case, and its proposal is filed.
	form, err = b.svc.SettleCandidate(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(form.Word) != 1 || form.Word[0].Kind != "gateway_mismatch" {
		t.Fatalf("the form shows %+v, want the mismatch case", form.Word)
	}
	in.Outcome, in.CasesSeen = payments.StatusFailed, form.CasesSeen
	if _, err := b.svc.ProposeResolution(ctx, fin1, in); err != nil {
		t.Fatalf("a proposal from the form read again = %v", err)
	}
}

// A case of the gateway's word resolved between the form's read and its submission is no news:
// the proposal is filed (the approval reads it the same way). It was refused as "a case opened
// or had news" (a review). Negative control (run by hand): comparing the form's name of the open
// set as a whole, refused.
func TestACaseResolvedWhileTheProposerTypesIsNoNews(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.flagged(t, "o-resolved-while-typing", 9900)
	b.capturedAtAnotherAmount(t, s, 100, payments.GatewaySucceeded)
	form, err := b.svc.SettleCandidate(ctx, s.ID)
	if err != nil || len(form.Word) != 1 {
		t.Fatalf("form: %d cases of the gateway's word, %v", len(form.Word), err)
	}
	b.exec(t, `UPDATE finance_cases SET resolved_at = now(), resolved_by = 'fin3', resolution = 'noted' WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID)
	if _, err := b.svc.ProposeResolution(ctx, fin1, payments.ProposalInput{SessionID: s.ID, Outcome: payments.StatusFailed, Seen: form.Session.Status,
		CasesSeen: form.CasesSeen, Reason: "no money was taken", Evidence: "gateway dashboard, ticket FIN-8"}); err != nil {
		t.Errorf("a case resolved since the form was read refused the proposal: %v", err)
	}
}
