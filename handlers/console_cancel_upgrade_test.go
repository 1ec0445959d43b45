package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
)

// Rolling deploy across 00730 (rolling-upgrade review, session 32; fixed: a form without an
// intent key is RequestCancel as before; negative control: RequestCancelOnce for it, refused):
// during the deploy, a payment page rendered by a
// replica of the previous release (9f8d11d: views/payment.templ's cancel-request-form has only its
// csrf_token; its live region is re-rendered by whichever replica answers) posts "Request cancel"
// to a new replica. The previous binary answered that form with a code; the new one refused it
// ("the cancel form is damaged; reload the page") because RequestCancelOnce demands an intent key
// that the old form never carried. operations.md: "The old binary keeps serving on the migrated
// schema" and a mixed fleet is the normal state of step 2.
func TestACancelFormOfThePreviousReleaseGetsItsCode(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	rec := sup.post("/payments", url.Values{"order_id": {"o-roll"}, "amount": {"19.99"}, "currency": {"EUR"}, "customer_contact": {"cust@example.com"}})
	doc := page(t, sup.follow(rec), http.StatusOK)
	id := text(doc, "payment-id")

	action, form := formValues(doc, "cancel-request-form")
	form.Del("intent") // the form as the previous release's page has it
	rec = sup.post(action, form)
	loc := rec.Header().Get("Location")
	var sent int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE payment_id = $1 AND kind = 'cancel_code'`, id).Scan(&sent); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(loc, "/payments/"+id+"?challenge=") || sent != 1 {
		flash := ""
		if rec.Code == http.StatusSeeOther {
			flash = text(page(t, sup.follow(rec), http.StatusOK), "flash-error")
		}
		t.Fatalf("Request cancel from a page of the previous release → %d %q, %d codes sent, flash %q: want the code sent as before",
			rec.Code, loc, sent, flash)
	}
}
