package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// TestBrowserAStaleRefundFormComesBackWithWhatWasTyped: the audit's case in Chromium. Finance
// types 3.00 and the reason into a Completed 10.00 payment's refund form; the shop's API refunds
// 3.00 meanwhile, and the page, being typed in, is not refreshed (live.js). The form, sent by
// htmx, refunded 3.00 more. Now the 409 answer is swapped in: the refusal in the flash, the page
// as it is (7.00 refundable), the form open with the amount and reason typed, no second gateway
// refund, no reload.
func TestBrowserAStaleRefundFormComesBackWithWhatWasTyped(t *testing.T) {
	b := newConsoleBench(t)
	_, e := b.replica(b.pool, "replica-limit", b.gw, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 100000} })
	b.user(t, "fin@example.com", access.RoleFinance)
	s := b.completed(t, "o-browser-stale-refund", 1000)
	srv := b.server(t, e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "fin@example.com")
	openLive(t, ctx, srv.URL+"/payments/"+s.ID)

	const reason = "ticket 4711: one book damaged"
	within(t, ctx, 20*time.Second,
		chromedp.SetValue(chromedp.CSS(`[data-testid="refund-amount-input"]`), "3.00"),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="refund-reason"]`), reason),
	)
	if _, err := b.svc.CreateRefund(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.RefundInput{PaymentID: s.ID, Amount: 300, RequestKey: "shop-key-1"}); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the live refresh held while typing", `document.documentElement.hasAttribute("data-live-stale")`)
	within(t, ctx, 20*time.Second,
		liveClick(chromedp.CSS(`[data-testid="refund-submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="flash-error"]`)),
	)
	waitJS(t, ctx, "the refusal, the page as it is and the form as typed", `(() => {
		const f = document.querySelector('[data-testid="flash-error"]').textContent;
		const form = document.querySelector('[data-testid="finance-refund-form"]');
		return f.includes("refunds changed since you read the page") &&
			document.querySelector('[data-testid="refundable"]').textContent.includes("7.00") &&
			form.querySelector('[name="amount"]').value === "3.00" &&
			form.querySelector('[name="reason"]').value === "`+reason+`" &&
			form.querySelector('[name="seen"]').value === "300.1.0"; })()`)
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refunds = %d, want 1 (the API's)", n)
	}
	noReload(t, ctx)
}
