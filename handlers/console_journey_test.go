package handlers_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
)

// TestAProposalRefusedBecauseAnotherWaitsKeepsWhatWasTyped: two finance users open "Settle by
// hand…" for the same flagged payment; the first proposes, the second — who typed a different
// reason and evidence — is refused 409 because a proposal already waits. The page showed only
// "Proposal #N … already waits": the second person's evidence (which they may need to reject
// the first proposal) was gone (an outside review, console journey). It is kept, read-only.
func TestAProposalRefusedBecauseAnotherWaitsKeepsWhatWasTyped(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.user(t, "fin2@example.com", access.RoleFinance)
	fin, fin2 := b.agent(t), b.agent(t)
	fin.login("fin@example.com")
	fin2.login("fin2@example.com")
	s := b.payment(t, "o-probe-two-proposers", 1500)
	b.flag(t, s.ID)

	form1 := hiddenValues(page(t, fin.get("/finance/resolutions/new?session="+s.ID), http.StatusOK), "propose-form")
	form2 := hiddenValues(page(t, fin2.get("/finance/resolutions/new?session="+s.ID), http.StatusOK), "propose-form")

	form1.Set("outcome", "Failed")
	form1.Set("reason", "customer abandoned")
	form1.Set("evidence", "ticket 1")
	page(t, fin.follow(fin.post("/finance/resolutions", form1)), http.StatusOK)

	const reason, evidence = "bank statement shows the capture on the 3rd", "statement line 42, ticket FIN-77"
	form2.Set("outcome", "Completed")
	form2.Set("reason", reason)
	form2.Set("evidence", evidence)
	doc := page(t, fin2.post("/finance/resolutions", form2), http.StatusConflict)
	if text(doc, "propose-kept-reason") != reason || text(doc, "propose-kept-evidence") != evidence {
		t.Fatalf("refused because proposal by fin@ waits: the page dropped the reason and evidence fin2 typed\n%s", text(doc, "propose-pending"))
	}
}

// TestTheCodeFormWithoutAnyContactSaysSo: a payment started in the console with the customer
// contact left empty (the field is optional) on an order with no contact either. "Request
// cancel" said "A one-time code went to the customer (). Ask them to read it to you" — empty
// parentheses, and no hint that the message has no address (an outside review, console journey).
func TestTheCodeFormWithoutAnyContactSaysSo(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	rec := sup.post("/payments", url.Values{"order_id": {"o-probe-no-contact"}, "amount": {"12.34"}, "currency": {"EUR"}, "customer_contact": {""}})
	doc := page(t, sup.follow(rec), http.StatusOK)
	action, form := formValues(doc, "cancel-request-form")
	doc = page(t, sup.follow(sup.post(action, form)), http.StatusOK)
	if got := text(doc, "challenge-sent"); strings.Contains(got, "()") || !strings.Contains(got, "no contact on file") {
		t.Fatalf("the code form names an empty contact: %q", got)
	}
}
