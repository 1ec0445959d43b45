package handlers_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/web"
)

// Console forms review, session 32 (each fixed in the commit that brought the test): support's refund form sent twice (a double click, or back and
// resubmit) while its code is open sends nothing the second time — but the console tells the
// agent, and writes in the audit log, that a code was sent. The cancel form says "nothing new
// was sent" in the same situation (docs/console.md: replays are recorded "with their outcome").
func TestARefundCodeFormSentAgainSaysNothingWasSent(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	s := b.completed(t, "o-forms-refund-twice", 1000)

	action, form := formValues(page(t, sup.get("/payments/"+s.ID), http.StatusOK), "support-refund-form")
	form.Set("amount", "4.00")
	form.Set("reason", "one item returned")
	page(t, sup.follow(sup.post(action, form)), http.StatusOK)
	doc := page(t, sup.follow(sup.post(action, form)), http.StatusOK) // the same form again

	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND kind = 'refund_code'`, s.ID); n != 1 {
		t.Fatalf("refund codes sent = %d, want 1", n)
	}
	var details []string
	rows, err := b.pool.Query(context.Background(), `SELECT detail FROM audit_log WHERE action = $1 AND target = $2 ORDER BY id`, payments.AuditRefundRequest, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d string
		_ = rows.Scan(&d)
		details = append(details, d)
	}
	if len(details) != 2 {
		t.Fatalf("audit entries = %v", details)
	}
	flash := text(doc, "flash")
	if strings.Contains(details[1], "code sent") || strings.Contains(flash, "went to the customer") {
		t.Fatalf("the resent form sent no code (1 in the outbox), yet:\n  audit: %q\n  flash: %q", details[1], flash)
	}
}

// Console forms review, session 32 (each fixed in the commit that brought the test): docs/console.md "Refunds": "the same form with another amount is
// refused ("reload the page")". Support's form sent again with another amount while its first
// code is open sends the customer a second code (for the other amount) instead, superseding the
// first and spending one of the payment's three code requests per hour.
func TestARefundCodeFormResentWithAnotherAmountIsRefused(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	s := b.completed(t, "o-forms-refund-other", 1000)

	action, form := formValues(page(t, sup.get("/payments/"+s.ID), http.StatusOK), "support-refund-form")
	form.Set("amount", "4.00")
	form.Set("reason", "one item returned")
	page(t, sup.follow(sup.post(action, form)), http.StatusOK)
	form.Set("amount", "3.00") // back button, another amount typed, the same form sent again
	doc := page(t, sup.follow(sup.post(action, form)), http.StatusOK)

	n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND kind = 'refund_code'`, s.ID)
	if n != 1 || !strings.Contains(text(doc, "flash-error"), "reload the page") {
		t.Fatalf("the same form with another amount: %d codes sent to the customer (want 1), flash %q / error %q (want a refusal saying reload the page)",
			n, text(doc, "flash"), text(doc, "flash-error"))
	}
}

// Console forms review, session 32 (each fixed in the commit that brought the test): an amount too large is told "must be greater than 0" on the refund
// forms, and "must be an integer in minor units" on the start-a-payment form, where amounts are
// typed in major units (19.99): obeying that message (typing 1999 for 19.99) asks for 100 times
// the money.
func TestAmountOutOfRangeMessagesFitWhatWasTyped(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.user(t, "sup@example.com", access.RoleSupport)
	fin := b.agent(t)
	fin.login("fin@example.com")
	s := b.completed(t, "o-forms-refund-huge", 1000)

	action, form := formValues(page(t, fin.get("/payments/"+s.ID), http.StatusOK), "finance-refund-form")
	form.Set("amount", "10000000000") // ten zeros too many: 10^12 cents
	form.Set("reason", "typo")
	doc := page(t, fin.follow(fin.post(action, form)), http.StatusOK)
	refundMsg := text(doc, "flash-error")

	sup := b.agent(t)
	sup.login("sup@example.com")
	page(t, sup.get("/payments/new"), http.StatusOK)
	rec := sup.post("/payments", url.Values{"order_id": {"o-forms-zero"}, "amount": {"0.00"}, "currency": {"EUR"}})
	createMsg := rec.Body.String()

	var bad []string
	if strings.Contains(refundMsg, "greater than 0") {
		bad = append(bad, "refund of 10000000000 EUR: "+refundMsg)
	}
	if strings.Contains(createMsg, "integer in minor units") {
		bad = append(bad, "start a payment of 0.00 EUR: \"amount must be an integer in minor units…\" (the form takes 19.99)")
	}
	if len(bad) > 0 {
		t.Fatalf("messages that do not fit what was typed:\n  %s", strings.Join(bad, "\n  "))
	}
}

// Console forms review, session 32 (each fixed in the commit that brought the test): a "Settle by hand" proposal for a flagged refund whose row is busy
// (its lock wait times out: EUNAVAIL, "busy, try again") is docs/console.md's "A proposal
// refused while the refund can still be proposed for (a missing field, a race) comes back as
// the payment's page … with the form open, what was typed in it". The handler reads the
// refusal's field through a *payments.Error it assumes is there; lockRefund wraps the lock
// timeout with fmt.Errorf, so that pointer is nil: a panic, a 500 page, and the reason and
// evidence finance typed are gone.
func TestARefundSettleProposalOnABusyRefundKeepsTheForm(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	var logged strings.Builder
	b.deps = func(d *web.Deps) { d.Logger = slog.New(slog.NewTextHandler(&logged, nil)) }
	_, e := b.replica(b.pool, "replica-short-lock", b.gw, func(c *payments.Config) { c.LockTimeout = 300 * time.Millisecond })
	fin := newAgent(t, e)
	fin.login("fin@example.com")
	s := b.completed(t, "o-forms-settle-busy", 2000)
	refundID := b.flaggedRefund(t, s, 1500)

	doc := page(t, fin.get("/payments/"+s.ID), http.StatusOK)
	action, ok := doc.Find(`[data-testid="refund-row"][data-id="` + refundID + `"] ` + testid("refund-settle-form")).Attr("action")
	if !ok {
		t.Fatal("no settle-by-hand form")
	}
	// Something else holds the refund's row a moment longer than the lock timeout.
	tx, err := b.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if _, err := tx.Exec(context.Background(), `SELECT 1 FROM refunds WHERE id = $1 FOR UPDATE`, refundID); err != nil {
		t.Fatal(err)
	}
	rec := fin.post(action, url.Values{"outcome": {"Failed"}, "reason": {"never executed, says the gateway"}, "evidence": {"ticket GW-9, two pages of notes"}})
	if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "ticket GW-9, two pages of notes") {
		t.Fatalf("a busy refund's proposal: %d, typed evidence kept: %v; the server logged:\n%s", rec.Code, strings.Contains(rec.Body.String(), "ticket GW-9"), logged.String())
	}
}

// fieldTiedToError checks that a form refused for one field marks that field aria-invalid and
// points it at the refusal's text with aria-describedby (the error element's id), and marks no
// other field of the form (others, by data-testid).
func fieldTiedToError(t *testing.T, doc *goquery.Document, field, errTestid string, others ...string) {
	t.Helper()
	in := doc.Find(testid(field))
	if in.Length() != 1 {
		t.Fatalf("no field %s", field)
	}
	inv, desc := in.AttrOr("aria-invalid", ""), in.AttrOr("aria-describedby", "")
	errID := doc.Find(testid(errTestid)).AttrOr("id", "")
	if inv != "true" || errID == "" || desc != errID || doc.Find("#"+errID).Length() != 1 {
		t.Errorf("%s after its refusal: aria-invalid=%q aria-describedby=%q; the error (%s) has id %q; want the field marked invalid and described by the error",
			field, inv, desc, errTestid, errID)
	}
	for _, o := range others {
		if v, ok := doc.Find(testid(o)).Attr("aria-invalid"); ok {
			t.Errorf("%s is marked aria-invalid=%q, but the refusal is about %s", o, v, field)
		}
	}
}

// TestAFormErrorMarksItsField: support's "Start a payment" refused for its amount, and
// finance's proposal refused for its evidence (blanks: a browser's required lets spaces
// through). The server named the field (data-field on the message) but the page did not tell
// assistive technology which field was wrong, nor why from the field (WCAG 1.3.1, 3.3.1; an
// outside review); the refund's "Settle by hand" form marked its field aria-invalid but did not
// point at its message either. Now each field at fault is aria-invalid and aria-describedby the
// message's id (invalidIf). Negative control: invalidIf without aria-describedby, or the
// new-payment form's amount without invalidIf, fails.
func TestAFormErrorMarksItsField(t *testing.T) {
	t.Parallel()
	b, _, flagged, _ := stuckBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup, fin := b.agent(t), b.agent(t)
	sup.login("sup@example.com")
	fin.login("fin@example.com")

	doc := page(t, sup.post("/payments", url.Values{"order_id": {"o-42"}, "amount": {"19.999"}, "currency": {"EUR"}}), http.StatusUnprocessableEntity)
	if f, _ := doc.Find(testid("new-payment-error")).Attr("data-field"); f != "amount" {
		t.Fatalf("error field %q", f)
	}
	fieldTiedToError(t, doc, "new-amount", "new-payment-error", "new-order-id", "new-currency", "new-contact")

	doc = page(t, fin.post("/finance/resolutions", url.Values{"session": {flagged.ID}, "outcome": {"Completed"}, "reason": {"paid"}, "evidence": {"   "}}), http.StatusUnprocessableEntity)
	if f, _ := doc.Find(testid("propose-error")).Attr("data-field"); f != "evidence" {
		t.Fatalf("error field %q", f)
	}
	fieldTiedToError(t, doc, "propose-evidence", "propose-error", "propose-reason")

	s := b.completed(t, "o-forms-settle-field", 2000)
	refundID := b.flaggedRefund(t, s, 1500)
	action := page(t, fin.get("/payments/"+s.ID), http.StatusOK).Find(`[data-testid="refund-row"][data-id="`+refundID+`"] `+testid("refund-settle-form")).AttrOr("action", "")
	if action == "" {
		t.Fatal("no settle-by-hand form")
	}
	doc = page(t, fin.post(action, url.Values{"outcome": {"Failed"}, "reason": {"never executed"}, "evidence": {" "}}), http.StatusUnprocessableEntity)
	fieldTiedToError(t, doc, "refund-settle-evidence", "flash-error", "refund-settle-reason")
}
