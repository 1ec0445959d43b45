package handlers_test

import (
	"context"
	"html"
	"net/http"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// Text from outside pitlane on a staff page — a flag's reason from the gateway's words, a case's
// detail, a webhook's error — sat inside our own sentence ("flagged <time>: <reason>"): right-to-
// left letters in it took the neutral characters and digits beside them along, so the date and
// the reason read in another order, and a reason ending in digits could pull the next figure
// into it (session 53's note). Each such place isolates it (<bdi>). Negative control (run by
// hand): without the <bdi> in payment.templ, the payment page fails.
func TestOutsideTextIsIsolatedFromTheSentenceAroundIt(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	fin := b.agent(t)
	fin.login("fin@example.com")
	s := b.payment(t, "o-bidi", 1500)
	const reason = "رفض البنك 100"
	b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = $3, next_check_at = NULL,
		created_at = $2::timestamptz - interval '2 hours', updated_at = $2::timestamptz - interval '2 hours' WHERE id = $1`, s.ID, b.clock.Now(), reason) // stuck for two hours
	want := "<bdi>" + html.EscapeString(reason) + "</bdi>"
	for _, path := range []string{"/payments/" + s.ID, "/finance/stuck", "/"} {
		rec := fin.get(path)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d", path, rec.Code)
		}
		if body := rec.Body.String(); !strings.Contains(body, want) {
			i := strings.Index(body, html.EscapeString(reason))
			t.Errorf("%s: the flag's reason is not isolated from the sentence around it: %q", path, body[max(i-80, 0):min(i+80, len(body))])
		}
	}
}

// The customer's contact (from outside: the shop's API, a checkout click) sits inside the
// sentence support reads aloud, "A one-time code went to the customer (<contact>). Ask them …":
// isolated, as the rest of 6a909fd's places (a review of it). Negative control (run by hand):
// codeRecipient without <bdi>, the sentence fails.
func TestTheContactIsIsolatedInTheCodeSentence(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	const contact = "علی 100@example.com"
	res, err := b.svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.CreateInput{OrderID: "o-bidi-contact", Amount: 1000, Currency: "EUR", CustomerContact: contact})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Session
	action, form := formValues(page(t, sup.get("/payments/"+s.ID), http.StatusOK), "cancel-request-form")
	form.Set("reason", "returned")
	rec := sup.post(action, form)
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("cancel request → %d\n%s", rec.Code, rec.Body)
	}
	body := sup.follow(rec).Body.String()
	esc := html.EscapeString(contact)
	i := strings.Index(body, `data-testid="challenge-sent"`)
	if i < 0 {
		j := strings.Index(body, html.EscapeString(contact))
		t.Fatalf("no challenge-sent sentence; contact at %d: %q", j, body[max(j-200, 0):min(j+200, len(body))])
	}
	sentence := body[i:min(i+400, len(body))]
	if !strings.Contains(sentence, "the customer (<bdi>"+esc+"</bdi>)") {
		t.Errorf("the contact is not isolated in our sentence: %q", sentence)
	}
}
