package handlers_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// The proposal form shows what the gateway said (the payment's open cases that carry its word)
// and sends back what it showed: a capture found while the proposer types refuses the proposal
// with the form shown again, the new case on it. The list of proposals points the approver at
// the cases. Negative control (run by hand): without the comparison, proposed.
func TestTheProposalFormShowsAndKeepsTheGatewaysWord(t *testing.T) {
	t.Parallel()
	b, _, flagged, _ := stuckBench(t)
	fin, fin2 := b.agent(t), b.agent(t)
	fin.login("fin@example.com")
	fin2.login("fin2@example.com")
	ctx := context.Background()

	doc := page(t, fin.get("/finance/resolutions/new?session="+flagged.ID), http.StatusOK)
	if doc.Find(testid("propose-word")).Length() != 0 {
		t.Fatal("a payment the gateway does not contradict shows gateway cases")
	}
	action, form := formValues(doc, "propose-form")
	// While the proposer types, a Check finds the gateway captured 10.00 of the 12.00.
	b.gw.SetAmount(flagged.GatewayPaymentID, 1000, "EUR")
	if _, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, flagged.ID); err != nil {
		t.Fatal(err)
	}
	form.Set("outcome", "Completed")
	form.Set("reason", "the customer's bank shows the charge")
	form.Set("evidence", "statement line 4")
	doc = page(t, fin.post(action, form), http.StatusConflict)
	wantText(t, doc, "propose-error", "the gateway's word about the payment changed")
	wantText(t, doc, "propose-word-case", "gateway_mismatch")
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE session_id = $1`, flagged.ID); n != 0 {
		t.Fatalf("%d proposals, want none", n)
	}
	// Proposed from the form read again; the approver's list names the case.
	action, form = formValues(doc, "propose-form")
	form.Set("outcome", "Failed")
	form.Set("reason", "10.00 of 12.00 taken: settle and refund by hand")
	form.Set("evidence", "gateway dashboard")
	if rec := fin.post(action, form); rec.Code != http.StatusSeeOther {
		t.Fatalf("proposal from the form read again = %d %s", rec.Code, rec.Body)
	}
	doc = page(t, fin2.get("/finance/resolutions"), http.StatusOK)
	wantText(t, doc, "resolution-word", "1 open case")

	// A form without cases_seen (a page of the previous release, or the field removed) showed
	// none of the gateway's cases: refused while one is open, not recorded as seen (the approval
	// would then have passed it: a review).
	other := b.payment(t, "o-word-no-field", 1500)
	b.flag(t, other.ID)
	b.gw.SetAmount(other.GatewayPaymentID, 1000, "EUR")
	if _, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, other.ID); err != nil {
		t.Fatal(err)
	}
	doc = page(t, fin.get("/finance/resolutions/new?session="+other.ID), http.StatusOK)
	action, form = formValues(doc, "propose-form")
	form.Del("cases_seen")
	form.Set("outcome", "Completed")
	form.Set("reason", "paid")
	form.Set("evidence", "statement")
	doc = page(t, fin.post(action, form), http.StatusConflict)
	wantText(t, doc, "propose-error", "the gateway's word about the payment changed")
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE session_id = $1`, other.ID); n != 0 {
		t.Fatalf("%d proposals from a form without cases_seen, want none", n)
	}
}

// "Settle by hand" of a Completed payment whose refund proposal waits named it "Proposal #1 by
// fin@example.com () already waits": a refund proposal has no outcome of a status (an outside
// review, console). It is named by what it proposes. Negative control (run by hand): the
// outcome, "()".
func TestTheProposePageNamesAWaitingRefundProposal(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	s := b.completed(t, "o-refund-waits", 2500)
	fin := b.agent(t)
	fin.login("fin@example.com")
	action, form := formValues(page(t, fin.get("/payments/"+s.ID), http.StatusOK), "finance-refund-form")
	form.Set("amount", "5.00")
	form.Set("reason", "goodwill")
	wantText(t, page(t, fin.follow(fin.post(action, form)), http.StatusOK), "refund-proposal-waiting", "5.00 EUR")
	doc := page(t, fin.get("/finance/resolutions/new?session="+s.ID), http.StatusOK)
	if got := strings.Join(strings.Fields(text(doc, "propose-pending")), " "); !strings.Contains(got, "(refund 5.00 EUR)") {
		t.Errorf("the waiting refund proposal is named %q, want what it proposes: (refund 5.00 EUR)", got)
	}
}
