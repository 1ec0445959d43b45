package handlers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// TestBrowserSupportRefundByCode: support refunds part of a Completed payment from its page in
// Chromium, with htmx swapping the payment block in place: the refund form sends the customer a
// code, the code form opens, a wrong code is refused on the page, the customer's code refunds.
// One refund at the gateway, one RefundIssued entry, the refund and what is left shown, no CSP
// refusal. Photographed for docs/console.md.
func TestBrowserSupportRefundByCode(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	s := b.completed(t, "o-browser-refund", 2500)
	srv := b.server(t, b.e)

	ctx := newBrowser(t)
	csp := watchCSP(t, ctx)
	within(t, ctx, 10*time.Second, chromedp.EmulateViewport(1280, 900))
	browserLogin(t, ctx, srv.URL, "sup@example.com")
	within(t, ctx, 20*time.Second,
		chromedp.Navigate(srv.URL+"/payments/"+s.ID),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="support-refund-form"]`)),
		chromedp.SetValue(chromedp.CSS(`[data-testid="refund-amount-input"]`), "10.00"),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="refund-reason"]`), "one of two items returned"),
	)
	if got := browserText(t, ctx, "refundable"); got != "25.00 EUR" {
		t.Fatalf("refundable before = %q", got)
	}
	screenshot(t, ctx, "payment-refund.png")
	marker, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.pitlaneMarker = "no reload"`))
	if err != nil || marker != "no reload" {
		t.Fatalf("marker: %q %v", marker, err)
	}
	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="refund-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="refund-code"]`)),
	)
	if msg := browserText(t, ctx, "flash"); !strings.Contains(msg, "code for the refund went to the customer") {
		t.Fatalf("flash after the request: %q", msg)
	}
	amount, code := b.refundCode(t, s.ID) // what the customer reads out
	if amount != "10.00 EUR" {
		t.Fatalf("the code names %q", amount)
	}
	wrong := "000000"
	if code == wrong {
		wrong = "111111"
	}
	typeInto(t, ctx, "refund-code", wrong)
	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="refund-confirm-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="flash-error"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="refund-code"]`)),
	)
	if msg := browserText(t, ctx, "flash-error"); !strings.Contains(msg, "wrong code") {
		t.Fatalf("wrong code message: %q", msg)
	}
	typeInto(t, ctx, "refund-code", code)
	screenshot(t, ctx, "payment-refund-code.png")
	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="refund-confirm-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="refund-row"]`)),
	)
	if got := browserText(t, ctx, "refund-status"); got != payments.RefundSucceeded {
		t.Fatalf("refund status on the page = %q", got)
	}
	if got := browserText(t, ctx, "refundable"); got != "15.00 EUR" {
		t.Fatalf("refundable after = %q", got)
	}
	if msg := browserText(t, ctx, "flash"); !strings.Contains(msg, "Refunded 10.00 EUR") {
		t.Fatalf("flash after the refund: %q", msg)
	}
	if marker, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`String(window.pitlaneMarker)`)); marker != "no reload" {
		t.Fatal("the page reloaded: htmx did not swap the payment block")
	}
	screenshot(t, ctx, "payment-refunds.png")
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refunds = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1 AND entry_type = 'RefundIssued' AND amount = 1000`, s.ID); n != 1 {
		t.Fatalf("RefundIssued entries of 10.00 = %d, want 1", n)
	}
	if n := b.audits(t, payments.AuditRefundConfirm, s.ID); n != 2 {
		t.Fatalf("refund confirmations audited = %d, want 2 (the wrong code and the right one)", n)
	}
	if got := csp(); len(got) > 0 {
		t.Fatalf("Content-Security-Policy refusals: %v", got)
	}
}
