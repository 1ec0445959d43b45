package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"pitlane/access"
	"pitlane/payments"
)

// hiddenValues reads the hidden inputs of form id: what the form carries of the page it was
// rendered with.
func hiddenValues(doc *goquery.Document, id string) url.Values {
	v := url.Values{}
	doc.Find(testid(id) + " input[type=hidden]").Each(func(_ int, in *goquery.Selection) {
		name, _ := in.Attr("name")
		val, _ := in.Attr("value")
		v.Set(name, val)
	})
	return v
}

// TestAProposalFormReadBeforeTheStateMovedProposesNothing: finance opened "Settle by hand" for a
// flagged Registered payment (the page said Registered) and wrote evidence for that state and
// Failed; meanwhile the gateway reported it Authorized (the customer's funds held) and a Check
// applied it, the flag staying. The form carried only the session, so the proposal was filed as
// "Authorized → Failed" under evidence written for Registered, and a second person's approval
// marked Failed a payment whose funds the gateway holds. Now the form carries the status it
// showed (seen) and is refused (409) with the payment as it is now, the reason and evidence as
// typed and the outcome to choose again; sent from there, it is proposed for what it shows.
func TestAProposalFormReadBeforeTheStateMovedProposesNothing(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	fin := b.agent(t)
	fin.login("fin@example.com")
	s := b.payment(t, "o-stale-proposal", 1500)
	b.flag(t, s.ID)

	doc := page(t, fin.get("/finance/resolutions/new?session="+s.ID), http.StatusOK)
	wantText(t, doc, "propose-status", "Registered")
	form := hiddenValues(doc, "propose-form")
	if form.Get("seen") != "Registered" {
		t.Fatalf("the form's seen = %q, want Registered", form.Get("seen"))
	}

	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	cur, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID)
	if err != nil || cur.Status != payments.StatusAuthorized || cur.FlaggedAt == nil {
		t.Fatalf("setup: %s flagged=%v %v", cur.Status, cur.FlaggedAt != nil, err)
	}

	const reason, evidence = "the customer never reached the bank's page", "gateway dashboard: pending for 3 days, customer confirms on the phone"
	form.Set("outcome", "Failed")
	form.Set("reason", reason)
	form.Set("evidence", evidence)
	rec := fin.post("/finance/resolutions", form)
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE session_id = $1`, s.ID); n != 0 {
		t.Fatalf("a proposal whose form showed Registered was filed for the Authorized payment (%d proposals): its evidence was written for another state", n)
	}
	doc = page(t, rec, http.StatusConflict)
	wantText(t, doc, "propose-error", "the payment moved from Registered to Authorized since you read it; nothing was proposed")
	wantText(t, doc, "propose-status", "Authorized")
	if got := doc.Find(testid("propose-reason")).Text(); got != reason {
		t.Fatalf("the form lost the reason: %q", got)
	}
	if got := doc.Find(testid("propose-evidence")).Text(); got != evidence {
		t.Fatalf("the form lost the evidence: %q", got)
	}
	if n := doc.Find(testid("propose-form") + " input[name=outcome][checked]").Length(); n != 0 {
		t.Fatal("the outcome chosen for Registered comes back chosen for Authorized")
	}

	// From the form as it came back (it shows Authorized), the person proposes again.
	form = hiddenValues(doc, "propose-form")
	if form.Get("seen") != "Authorized" {
		t.Fatalf("the form sent back carries seen %q, want Authorized", form.Get("seen"))
	}
	form.Set("outcome", "Completed")
	form.Set("reason", "the gateway holds the funds")
	form.Set("evidence", evidence)
	page(t, fin.follow(fin.post("/finance/resolutions", form)), http.StatusOK)
	var at string
	if err := b.pool.QueryRow(context.Background(), `SELECT status_at_proposal FROM resolution_proposals WHERE session_id = $1`, s.ID).Scan(&at); err != nil || at != "Authorized" {
		t.Fatalf("proposal made on %q (%v), want Authorized", at, err)
	}
}
