package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// wantStaleRefundForm checks the answer to a refund form the payment's refunds outran: the
// payment's page as it is now (409), the refusal readable in the flash, the form open again with
// what was typed, and its seen the page's own.
func wantStaleRefundForm(t *testing.T, doc *goquery.Document, formID, amount, reason, refundable string) {
	t.Helper()
	wantText(t, doc, "flash-error", "refunds changed since you read the page")
	wantText(t, doc, "flash-error", "read the page again")
	wantText(t, doc, "refundable", refundable)
	_, form := formValues(doc, formID)
	if form.Get("amount") != amount || form.Get("reason") != reason {
		t.Fatalf("the form came back with amount %q reason %q, want what was typed: %q %q", form.Get("amount"), form.Get("reason"), amount, reason)
	}
	if doc.Find(testid(formID)).Closest("[data-live-keep]").Length() != 1 {
		t.Fatal("the form sent back does not hold the live refresh (data-live-keep): the next refresh would drop what was typed")
	}
}

// TestARefundFormFromAStalePageRefundsNothing: two finance users (or one in two tabs) had a
// Completed 10.00 EUR payment's page open, both showing "refundable now 10.00". F1 refunded 3.00
// for ticket 4711; F2, still typing the reason (live.js does not refresh a region someone types
// in), sent 3.00 for the same ticket, and it was accepted: a second gateway refund and
// RefundIssued entry, the customer got 6.00 back. The form's intent key tells the same form
// apart, not a second form of a page read before the first refund. Now the form carries what
// counted against the refundable amount on its page (seen) and is refused: the page as it is,
// the form with the typed amount and reason, for F2 to decide again. Sent again from there, it
// refunds; F1's own form sent again still replays its refund (seen is judged after the replay).
func TestARefundFormFromAStalePageRefundsNothing(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	_, e := b.replica(b.pool, "replica-limit", b.gw, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 100000} })
	b.user(t, "f1@example.com", access.RoleFinance)
	b.user(t, "f2@example.com", access.RoleFinance)
	f1, f2 := newAgent(t, e), newAgent(t, e)
	f1.login("f1@example.com")
	f2.login("f2@example.com")
	s := b.completed(t, "o-stale-refund", 1000)

	doc1 := page(t, f1.get("/payments/"+s.ID), http.StatusOK)
	doc2 := page(t, f2.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, doc2, "refundable", "10.00 EUR")
	a1, form1 := formValues(doc1, "finance-refund-form")
	a2, form2 := formValues(doc2, "finance-refund-form")
	if form2.Get("seen") != "0.0.0" {
		t.Fatalf("the form's seen = %q, want 0.0.0 (nothing refunded on its page)", form2.Get("seen"))
	}
	form1.Set("amount", "3.00")
	form1.Set("reason", "ticket 4711: one book damaged")
	wantText(t, page(t, f1.follow(f1.post(a1, form1)), http.StatusOK), "flash", "Refunded 3.00 EUR")

	form2.Set("amount", "3.00")
	form2.Set("reason", "ticket 4711: one book damaged")
	rec := f2.post(a2, form2)
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("a refund form read before another refund of the payment refunded anyway: gateway refunds = %d, want 1", n)
	}
	doc := page(t, rec, http.StatusConflict)
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 1 {
		t.Fatalf("RefundIssued entries = %d, want 1", n)
	}
	wantStaleRefundForm(t, doc, "finance-refund-form", "3.00", "ticket 4711: one book damaged", "7.00 EUR")
	wantText(t, doc, "flash-error", "now 3.00 EUR refunded")
	if n := b.audits(t, payments.AuditRefund, s.ID); n != 2 {
		t.Fatalf("payment.refund audit entries = %d, want 2 (the refund and the refusal)", n)
	}

	// F1's form sent again (a lost answer) still finds its refund.
	wantText(t, page(t, f1.follow(f1.post(a1, form1)), http.StatusOK), "flash", "sent already")
	// F2, having read the page as it is, sends the form it got back: a second refund, meant.
	a2, form2 = formValues(doc, "finance-refund-form")
	if form2.Get("seen") != "300.1.0" {
		t.Fatalf("the form sent back carries seen %q, want 300.1.0 (the page as it is now)", form2.Get("seen"))
	}
	doc = page(t, f2.follow(f2.post(a2, form2)), http.StatusOK)
	wantText(t, doc, "flash", "Refunded 3.00 EUR")
	wantText(t, doc, "refundable", "4.00 EUR")
	if n := b.gw.Calls(fakegw.OpRefund); n != 2 {
		t.Fatalf("gateway refunds = %d, want 2", n)
	}
}

// TestARefundFormReadBeforeAnAPIRefundRefundsNothing: the shop's API refunded 4.00 of a 10.00
// payment while its page was open at finance; the page's form, sent for 4.00, refunded 4.00 more.
// Now refused with the page as it is (6.00 refundable) and the form as typed.
func TestARefundFormReadBeforeAnAPIRefundRefundsNothing(t *testing.T) {
	t.Parallel()
	b, f1, action, form := financeFormBeforeAnAPIRefund(t, "o-stale-api-refund")
	form.Set("amount", "4.00")
	form.Set("reason", "customer asked for 4.00 back")
	rec := f1.post(action, form)
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("a refund form read before the API's refund refunded anyway: gateway refunds = %d, want 1", n)
	}
	doc := page(t, rec, http.StatusConflict)
	wantStaleRefundForm(t, doc, "finance-refund-form", "4.00", "customer asked for 4.00 back", "6.00 EUR")
}

// TestASupportRefundFormFromAStalePageSendsNoCode: support's form (a one-time code naming the
// amount goes to the customer) had the same gap: read before finance refunded 3.00, it sent the
// customer a code for 3.00 more. Now refused, nothing sent, the form back as typed.
func TestASupportRefundFormFromAStalePageSendsNoCode(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	s := b.completed(t, "o-stale-support-refund", 1000)

	doc := page(t, sup.get("/payments/"+s.ID), http.StatusOK)
	action, form := formValues(doc, "support-refund-form")
	if _, err := b.svc.CreateRefund(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.RefundInput{PaymentID: s.ID, Amount: 300, RequestKey: "shop-key-1"}); err != nil {
		t.Fatal(err)
	}
	form.Set("amount", "3.00")
	form.Set("reason", "ticket 4711")
	rec := sup.post(action, form)
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, s.ID); n != 0 {
		t.Fatalf("a support refund form read before another refund sent the customer %d codes, want none", n)
	}
	doc = page(t, rec, http.StatusConflict)
	wantStaleRefundForm(t, doc, "support-refund-form", "3.00", "ticket 4711", "7.00 EUR")
	wantText(t, doc, "flash-error", "no code was sent")
	if !strings.Contains(text(doc, "flash-error"), "7.00 EUR refundable") {
		t.Fatalf("flash-error %q does not say what is refundable now", text(doc, "flash-error"))
	}
}

// TestARefundFormWithoutSeenIsJudgedByItsAmount: a page rendered before the forms carried seen
// (a rolling deploy) still refunds, judged by its amount as before, rather than being refused
// for a field its page never had.
func TestARefundFormWithoutSeenIsJudgedByItsAmount(t *testing.T) {
	t.Parallel()
	b, f1, action, form := financeFormBeforeAnAPIRefund(t, "o-old-refund-form")
	form.Del("seen")
	form.Set("amount", "2.00")
	form.Set("reason", "an old page")
	wantText(t, page(t, f1.follow(f1.post(action, form)), http.StatusOK), "flash", "Refunded 2.00 EUR")
	if n := b.gw.Calls(fakegw.OpRefund); n != 2 {
		t.Fatalf("gateway refunds = %d, want 2", n)
	}
}

// financeFormBeforeAnAPIRefund opens the finance refund form of a 10.00 EUR payment of order
// (signed in as f1, no four-eyes limit in the way), then the shop's API refunds 4.00 of it.
func financeFormBeforeAnAPIRefund(t *testing.T, order string) (b *consoleBench, f1 *agent, action string, form url.Values) {
	t.Helper()
	b = newConsoleBench(t)
	_, e := b.replica(b.pool, "replica-limit", b.gw, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 100000} })
	b.user(t, "f1@example.com", access.RoleFinance)
	f1 = newAgent(t, e)
	f1.login("f1@example.com")
	s := b.completed(t, order, 1000)
	doc := page(t, f1.get("/payments/"+s.ID), http.StatusOK)
	action, form = formValues(doc, "finance-refund-form")
	if _, err := b.svc.CreateRefund(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "shop-key-1"}); err != nil {
		t.Fatal(err)
	}
	return b, f1, action, form
}
