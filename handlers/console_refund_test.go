package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// completed creates a session and settles it Completed (the gateway says it succeeded).
func (b *consoleBench) completed(t testing.TB, order string, amount int64) payments.Session {
	t.Helper()
	s := b.payment(t, order, amount)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	s, err := b.svc.Check(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, s.ID)
	if err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	return s
}

var refundCodeRe = regexp.MustCompile(`refund of ([0-9.]+ [A-Z]{3}) for order \S+ is (\d{6})\.`)

// refundCode reads the last refund code the customer received, and the amount it names.
func (b *consoleBench) refundCode(t testing.TB, sessionID string) (amount, code string) {
	t.Helper()
	var body string
	if err := b.pool.QueryRow(context.Background(), `SELECT body FROM outbox WHERE payment_id = $1 AND kind = 'refund_code' ORDER BY id DESC LIMIT 1`,
		sessionID).Scan(&body); err != nil {
		t.Fatalf("no refund code in the outbox: %v", err)
	}
	m := refundCodeRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no refund code in %q", body)
	}
	return m[1], m[2]
}

// formValues reads a form of the page (its hidden inputs and prefilled values) for resubmitting.
func formValues(doc *goquery.Document, id string) (action string, v url.Values) {
	form := doc.Find(testid(id))
	action, _ = form.Attr("action")
	v = url.Values{}
	form.Find("input[name]").Each(func(_ int, in *goquery.Selection) {
		name, _ := in.Attr("name")
		val, _ := in.Attr("value")
		v.Set(name, val)
	})
	return action, v
}

// Support refunds part of a Completed payment from its page: the form (with its intent key) sends
// the customer a code naming the amount; sent twice, it sends one code; a wrong code refunds
// nothing; the right code refunds once, and again (a double submit) only replays. The page then
// shows the refund and what is left to refund. Every step is audited.
func TestConsoleSupportRefundByCode(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", "support")
	sup := b.agent(t)
	sup.login("sup@example.com")
	s := b.completed(t, "o-console-refund", 1000)

	doc := page(t, sup.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, doc, "refundable", "10.00 EUR")
	action, form := formValues(doc, "support-refund-form")
	if form.Get("intent") == "" || form.Get("amount") != "10.00" || form.Get("csrf_token") == "" {
		t.Fatalf("refund form %s %v: want an intent key, the full amount prefilled and a CSRF token", action, form)
	}
	// Without the CSRF token: refused, nothing sent.
	if rec := sup.post(action, url.Values{"csrf_token": {""}, "amount": {"4.00"}, "reason": {"x"}, "intent": {form.Get("intent")}}); rec.Code != http.StatusForbidden {
		t.Fatalf("refund without CSRF = %d", rec.Code)
	}
	form.Set("amount", "4.00")
	form.Set("reason", "one item returned")
	rec := sup.post(action, form)
	if loc := rec.Header().Get("Location"); rec.Code != http.StatusSeeOther || loc == "/payments/"+s.ID {
		t.Fatalf("request code → %d %q", rec.Code, loc)
	}
	doc = page(t, sup.follow(rec), http.StatusOK)
	wantText(t, doc, "flash", "code for the refund went to the customer")
	wantText(t, doc, "refund-confirm", "Confirm the refund of 4.00 EUR")
	confirm, _ := doc.Find(testid("refund-confirm-form")).Attr("action")
	// The same form sent again (a double click): the same code, no second message.
	if again := sup.post(action, form); again.Header().Get("Location") != rec.Header().Get("Location") {
		t.Fatalf("the form again → %q, want %q", again.Header().Get("Location"), rec.Header().Get("Location"))
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND kind = 'refund_code'`, s.ID); n != 1 {
		t.Fatalf("refund codes sent = %d, want 1", n)
	}
	amount, code := b.refundCode(t, s.ID)
	if amount != "4.00 EUR" {
		t.Fatalf("the code names %q, want 4.00 EUR", amount)
	}
	wrong := "000000"
	if code == wrong {
		wrong = "111111"
	}
	doc = page(t, sup.follow(sup.post(confirm, url.Values{"code": {wrong}})), http.StatusOK)
	wantText(t, doc, "flash-error", "wrong code")
	if doc.Find(testid("refund-code")).Length() != 1 || doc.Find(testid("refund-row")).Length() != 0 {
		t.Fatal("after a wrong code: the code form closed, or a refund appeared")
	}
	doc = page(t, sup.follow(sup.post(confirm, url.Values{"code": {code}})), http.StatusOK)
	wantText(t, doc, "flash", "Refunded 4.00 EUR")
	wantText(t, doc, "refund-status", "Succeeded")
	wantText(t, doc, "refundable", "6.00 EUR")
	if _, next := formValues(doc, "support-refund-form"); next.Get("intent") == form.Get("intent") || next.Get("amount") != "6.00" {
		t.Fatalf("the next refund form reuses the intent key or does not offer the rest: %v", next)
	}
	doc = page(t, sup.follow(sup.post(confirm, url.Values{"code": {code}})), http.StatusOK)
	wantText(t, doc, "flash", "already used")
	if doc.Find(testid("refund-row")).Length() != 1 || b.gw.Calls(fakegw.OpRefund) != 1 {
		t.Fatalf("refunds %d, gateway refunds %d: want 1 and 1", doc.Find(testid("refund-row")).Length(), b.gw.Calls(fakegw.OpRefund))
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 1 {
		t.Fatalf("RefundIssued entries = %d", n)
	}
	if r, c := b.audits(t, payments.AuditRefundRequest, s.ID), b.audits(t, payments.AuditRefundConfirm, s.ID); r != 2 || c != 3 {
		t.Fatalf("audit: %d code requests, %d confirmations; want 2 and 3", r, c)
	}
	wantText(t, doc, "challenge-action", "refund of 4.00 EUR")
}

// Finance refunds within REFUND_DIRECT_LIMIT from the page at once; the same form sent twice
// refunds once. Past the limit the form becomes a proposal the page shows as waiting; its
// proposer's approval is refused, another finance user's refunds. Through the real router with
// sessions, CSRF and roles.
func TestConsoleFinanceRefundDirectAndFourEyes(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	_, e := b.replica(b.pool, "replica-limit", b.gw, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 500} })
	b.user(t, "f1@example.com", "finance")
	b.user(t, "f2@example.com", "finance")
	f1, f2 := newAgent(t, e), newAgent(t, e)
	f1.login("f1@example.com")
	f2.login("f2@example.com")
	s := b.completed(t, "o-finance-console-refund", 2000)

	doc := page(t, f1.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, doc, "refund-limit", "up to 5.00 EUR")
	action, form := formValues(doc, "finance-refund-form")
	form.Set("amount", "3.00")
	form.Set("reason", "late delivery")
	doc = page(t, f1.follow(f1.post(action, form)), http.StatusOK)
	wantText(t, doc, "flash", "Refunded 3.00 EUR")
	// The same form again (a double submit): nothing new.
	doc = page(t, f1.follow(f1.post(action, form)), http.StatusOK)
	wantText(t, doc, "flash", "sent already")
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refunds after a double submit = %d, want 1", n)
	}
	wantText(t, doc, "refundable", "17.00 EUR")

	// 3.00 more passes the 5.00 limit: a proposal, no refund.
	action, form = formValues(doc, "finance-refund-form")
	form.Set("amount", "3.00")
	form.Set("reason", "goodwill")
	doc = page(t, f1.follow(f1.post(action, form)), http.StatusOK)
	wantText(t, doc, "flash", "proposal #")
	wantText(t, doc, "refund-proposal-waiting", "3.00 EUR proposed by f1@example.com")
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refunds after the proposal = %d, want 1", n)
	}
	// Support sees the proposal waiting, but no link to the finance page it may not open.
	b.user(t, "s1@example.com", "support")
	sup := newAgent(t, e)
	sup.login("s1@example.com")
	sdoc := page(t, sup.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, sdoc, "refund-proposal-waiting", "3.00 EUR proposed by f1@example.com")
	// The proposal's 3.00 is spoken for: 14.00 is refundable, and support's code for more is
	// refused with the proposal named, nothing sent to the customer.
	wantText(t, sdoc, "refundable", "14.00 EUR")
	saction, sform := formValues(sdoc, "support-refund-form")
	if got := sform.Get("amount"); got != "14.00" {
		t.Fatalf("support's form offers %q, want 14.00", got)
	}
	sform.Set("amount", "15.00")
	sform.Set("reason", "the customer asked")
	sdoc = page(t, sup.follow(sup.post(saction, sform)), http.StatusOK)
	wantText(t, sdoc, "flash-error", "waits for approval; approve or reject it first")
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, s.ID); n != 0 {
		t.Fatalf("messages to the customer = %d, want 0", n)
	}
	if n := sdoc.Find(testid("refund-proposal-waiting") + " a").Length(); n != 0 {
		t.Fatalf("support sees %d links to /finance/resolutions, want none", n)
	}
	if n := doc.Find(testid("refund-proposal-waiting") + " a").Length(); n != 1 {
		t.Fatalf("finance sees %d links to the proposal, want 1", n)
	}
	rdoc := page(t, f1.get("/finance/resolutions"), http.StatusOK)
	wantText(t, rdoc, "resolution-outcome", "refund 3.00 EUR")
	approve, _ := rdoc.Find(testid("approve-form")).Attr("action")
	rdoc = page(t, f1.follow(f1.post(approve, nil)), http.StatusOK)
	wantText(t, rdoc, "flash-error", "second finance or admin user must approve")
	page(t, f2.get("/finance/resolutions"), http.StatusOK)
	rdoc = page(t, f2.follow(f2.post(approve, nil)), http.StatusOK)
	wantText(t, rdoc, "flash", "approved: refund 3.00 EUR")

	doc = page(t, f1.get("/payments/"+s.ID), http.StatusOK)
	if n := doc.Find(testid("refund-row")).Length(); n != 2 || doc.Find(testid("refund-proposal-waiting")).Length() != 0 {
		t.Fatalf("refund rows %d (want 2), proposal still waiting %d", n, doc.Find(testid("refund-proposal-waiting")).Length())
	}
	wantText(t, doc, "refundable", "14.00 EUR")
	if n := b.gw.Calls(fakegw.OpRefund); n != 2 {
		t.Fatalf("gateway refunds = %d, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 2 {
		t.Fatalf("RefundIssued entries = %d, want 2", n)
	}
	if n := b.audits(t, payments.AuditRefund, s.ID); n != 2 {
		t.Fatalf("payment.refund audit entries = %d, want 2 (the refund and its replay)", n)
	}
	if p, a := b.audits(t, payments.AuditResolutionPropose, s.ID), b.audits(t, payments.AuditResolutionApprove, s.ID); p != 1 || a != 1 {
		t.Fatalf("audit: %d proposals, %d approvals", p, a)
	}
}

// A flagged refund settled by hand from the console: finance proposes Failed on the payment's
// page, the page then says a proposal waits (no second form), the proposer's approval is
// refused and a second finance user's goes through: the refund is Failed and refundable again.
func TestRefundSettledByHandInTheConsole(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin1@example.com", access.RoleFinance)
	b.user(t, "fin2@example.com", access.RoleFinance)
	s := b.completed(t, "o-refund-stuck", 2000)
	refundID := b.flaggedRefund(t, s, 1500)
	fin1, fin2 := b.agent(t), b.agent(t)
	fin1.login("fin1@example.com")
	fin2.login("fin2@example.com")

	doc := page(t, fin1.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, doc, "refundable", "5.00")
	form := doc.Find(`[data-testid="refund-row"][data-id="` + refundID + `"] ` + testid("refund-settle-form"))
	action, ok := form.Attr("action")
	if !ok {
		t.Fatal("no settle-by-hand form on the flagged refund")
	}
	// Refused for a missing field: the page again (422), the form open with what was typed, the
	// field marked, the live refresh held; nothing proposed.
	rec := fin1.post(action, url.Values{"outcome": {"Failed"}, "reason": {"never executed, says the gateway"}, "evidence": {" "}})
	doc = page(t, rec, http.StatusUnprocessableEntity)
	wantText(t, doc, "flash-error", "evidence")
	settle := doc.Find(`[data-testid="refund-row"][data-id="` + refundID + `"] ` + testid("refund-settle"))
	if _, open := settle.Attr("open"); !open || settle.AttrOr("data-live-keep", "no") == "no" {
		t.Fatalf("the refused form is not open and held: %s", settleHTML(settle))
	}
	if settle.Find(testid("refund-settle-reason")).Text() != "never executed, says the gateway" ||
		settle.Find(testid("refund-settle-failed")).AttrOr("checked", "no") == "no" ||
		settle.Find(testid("refund-settle-evidence")).AttrOr("aria-invalid", "") != "true" {
		t.Fatalf("the refused form lost what was typed: %s", settleHTML(settle))
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals`); n != 0 {
		t.Fatalf("%d proposals after a refusal", n)
	}
	rec = fin1.post(action, url.Values{"outcome": {"Failed"}, "reason": {"never executed, says the gateway"}, "evidence": {"ticket GW-9"}})
	if loc := rec.Header().Get("Location"); rec.Code != http.StatusSeeOther || !strings.HasPrefix(loc, "/finance/resolutions#proposal-") {
		t.Fatalf("propose: %d to %q", rec.Code, loc)
	}
	doc = page(t, fin1.follow(rec), http.StatusOK)
	wantText(t, doc, "flash", "A second finance or admin user must approve it")
	row := doc.Find(testid("resolution-row"))
	if !strings.Contains(row.Text(), "Pending → Failed") {
		t.Fatalf("the proposal's row: %q", row.Text())
	}
	approve, _ := row.Find(testid("approve-form")).Attr("action")

	// While it waits: no second proposal form (for another flagged refund of the payment either:
	// one proposal waits per payment), and no "Retry now" for the refund people are deciding on.
	other := b.flaggedRefund(t, s, 300)
	doc = page(t, fin1.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, doc, "refund-settle-waiting", "waits for a second")
	if doc.Find(testid("refund-settle-form")).Length() != 0 {
		t.Fatal("a second proposal form while one waits")
	}
	inRow := func(id, what string) *goquery.Selection {
		return doc.Find(`[data-testid="refund-row"][data-id="` + id + `"] ` + testid(what))
	}
	if inRow(refundID, "refund-retry-form").Length() != 0 || inRow(other, "refund-retry-form").Length() != 1 ||
		!strings.Contains(inRow(other, "refund-settle-blocked").Text(), "one proposal waits per payment") {
		t.Fatalf("the refunds' rows while a proposal waits: %s", settleHTML(doc.Find(testid("refunds-table"))))
	}
	doc = page(t, fin1.follow(fin1.post(approve, nil)), http.StatusOK)
	wantText(t, doc, "flash-error", "second finance or admin user")
	doc = page(t, fin2.follow(fin2.post(approve, nil)), http.StatusOK)
	wantText(t, doc, "resolution-state", "approved")
	wantText(t, doc, "flash", "refund "+refundID[:8]+" of payment "+s.ID[:8]+" of order "+s.OrderID+" is Failed")
	if n := b.count(t, `SELECT count(*) FROM refunds WHERE id = $1 AND status = 'Failed' AND flagged_at IS NULL`, refundID); n != 1 {
		t.Fatal("the approved outcome was not applied")
	}
	doc = page(t, fin2.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, doc, "refundable", "17.00") // the other flagged refund still holds 3.00

	// Settled Failed by hand, it can only be corrected to Succeeded (the gateway paid it after
	// all): Failed again is refused with the form kept, which offers Succeeded alone; the
	// correction is proposed, reads "Failed → Succeeded", and once approved the refund is
	// Succeeded with its one RefundIssued entry.
	doc = page(t, fin1.post(action, url.Values{"outcome": {"Failed"}, "reason": {"r"}, "evidence": {"e"}}), http.StatusUnprocessableEntity)
	wantText(t, doc, "flash-error", "corrected to Succeeded")
	form = doc.Find(`[data-testid="refund-row"][data-id="` + refundID + `"] ` + testid("refund-settle-form"))
	if form.Find(testid("refund-settle-succeeded")).AttrOr("aria-invalid", "") != "true" || form.Find(testid("refund-settle-failed")).Length() != 0 {
		t.Fatalf("the correction form: %s", settleHTML(form))
	}
	rec = fin1.post(action, url.Values{"outcome": {"Succeeded"}, "reason": {"paid on day 3 after all"}, "evidence": {"gateway dashboard"}})
	doc = page(t, fin1.follow(rec), http.StatusOK)
	row = doc.Find(testid("resolution-row")).First()
	if !strings.Contains(row.Text(), "Failed → Succeeded") {
		t.Fatalf("the correction's row: %q", row.Text())
	}
	approve, _ = row.Find(testid("approve-form")).Attr("action")
	doc = page(t, fin2.follow(fin2.post(approve, nil)), http.StatusOK)
	wantText(t, doc, "flash", "refund "+refundID[:8]+" of payment "+s.ID[:8]+" of order "+s.OrderID+" is Succeeded")
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE refund_id = $1 AND entry_type = 'RefundIssued' AND amount = 1500`, refundID); n != 1 {
		t.Fatalf("RefundIssued entries of the corrected refund = %d, want 1", n)
	}
	doc = page(t, fin2.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, doc, "refundable", "2.00")
}

// settleHTML is a selection's HTML for a failure message.
func settleHTML(s *goquery.Selection) string {
	h, _ := s.Html()
	return h
}

// flaggedRefund inserts a refund of the payment that the patrol gave up on: Pending, flagged
// "no final answer" after nine checks, and returns its id.
func (b *consoleBench) flaggedRefund(t *testing.T, s payments.Session, amount int64) string {
	t.Helper()
	var id string
	if err := b.pool.QueryRow(context.Background(), `INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key,
			created_at, updated_at, flagged_at, flag_reason, check_attempts)
		VALUES (gen_random_uuid(), $1, $2, $3, 'EUR', 'Pending', gen_random_uuid()::text, $4, $4, $4, 'no final answer', 9) RETURNING id::text`,
		s.ID, s.OrderID, amount, consoleT0).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}
