package handlers_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// refusingNotifier is a NOTIFY_WEBHOOK_URL that answers every message with an error.
type refusingNotifier struct{}

func (refusingNotifier) Notify(context.Context, payments.Message) error {
	return errors.New("notify: the endpoint answered 503")
}

// A code whose message the notifier refused is not announced as gone to the customer: the page
// says it could not be sent yet and why, and the audit says so too. Before, support read "A
// one-time code went to the customer. Ask them to read it to you." and the audit "code sent"
// while the customer had nothing to read out (an outside review, outbox). Both forms: the
// cancel's and the refund's, each sent twice (the second answers the form's open code, whose
// message still waits for its retry). Negative control: with notYetSent answering its
// arguments, the pages say the code went to the customer; without openChallengeOf's look at
// the outbox, the second answer says nothing of it.
func TestConsoleSaysWhenACodeCouldNotBeSentYet(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	_, e := b.replica(b.pool, "replica-refusing", b.gw, func(c *payments.Config) { c.Notifier = refusingNotifier{} })
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := newAgent(t, e)
	sup.login("sup@example.com")
	for _, tc := range []struct {
		form, action string
		payment      func(testing.TB, string, int64) payments.Session
	}{
		{"cancel-request-form", payments.AuditCancelRequest, b.payment},
		{"support-refund-form", payments.AuditRefundRequest, b.completed},
	} {
		s := tc.payment(t, "o-undelivered-"+tc.form, 1000)
		action, form := formValues(page(t, sup.get("/payments/"+s.ID), http.StatusOK), tc.form)
		form.Set("reason", "returned")
		rec := sup.post(action, form)
		if rec.Code != http.StatusSeeOther {
			t.Fatalf("%s → %d\n%s", tc.form, rec.Code, rec.Body)
		}
		doc := page(t, sup.follow(rec), http.StatusOK)
		wantText(t, doc, "flash", "could not be sent to the customer yet (notify: the endpoint answered 503)")
		// The code form beside it says the same, not that the code went to the customer (an
		// outside review, a11y: the flash and the form contradicted each other).
		wantText(t, doc, "challenge-undelivered", "could not be sent to the customer (cust@example.com) yet (notify: the endpoint answered 503)")
		if doc.Find(testid("challenge-sent")).Length() != 0 {
			t.Errorf("%s: the code form says the code went to the customer", tc.form)
		}
		// The same form sent again (a reload, the back button) answers its open code: still
		// not delivered, and it says so.
		rec = sup.post(action, form)
		if rec.Code != http.StatusSeeOther {
			t.Fatalf("%s again → %d\n%s", tc.form, rec.Code, rec.Body)
		}
		doc = page(t, sup.follow(rec), http.StatusOK)
		wantText(t, doc, "flash", "could not be sent to the customer yet (notify: the endpoint answered 503)")
		if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2 AND detail LIKE '%not delivered yet: notify: the endpoint answered 503%'`,
			tc.action, s.ID); n != 2 {
			t.Fatalf("%d audit entries of %s saying the code was not delivered, want 2", n, tc.action)
		}
	}
}
