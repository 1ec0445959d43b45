package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// A code replaced by a newer one is dead (confirming it answers 410), and the console says so
// ("This code can no longer be used (expired, replaced by a newer one or out of attempts)").
// Before, the page offered the replaced code's form, with its attempts left, and an "Enter
// code" link on its row: PaymentDetail never read superseded_at, so ChallengeInfo.Pending called
// a replaced challenge live, and support typed the customer's new code into the dead form in a
// loop (an outside review).
func TestReplacedCodeIsNotOfferedAsLive(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	s := b.payment(t, "o-review-replaced", 1500)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")

	first := sup.post("/payments/"+s.ID+"/cancel", cancelForm())
	locA := first.Header().Get("Location")
	u, _ := url.Parse(locA)
	chA := u.Query().Get("challenge")
	if chA == "" {
		t.Fatalf("no challenge in %q", locA)
	}
	// A second code (another tab, a colleague): it replaces the first.
	second := sup.post("/payments/"+s.ID+"/cancel", cancelForm())
	if second.Code != http.StatusSeeOther || !strings.Contains(second.Header().Get("Location"), "challenge=") {
		t.Fatalf("second request: %d %q", second.Code, second.Header().Get("Location"))
	}

	// The replaced code is dead: a confirmation of it is refused as expired ...
	doc := page(t, sup.follow(sup.post("/payments/"+s.ID+"/cancel/"+chA, url.Values{"code": {"123456"}})), http.StatusOK)
	t.Logf("flash after confirming the replaced challenge: %q", text(doc, "flash-error"))
	// ... and the page it redirects to (its own ?challenge=) must say so, not offer its form.
	if n := doc.Find(testid("cancel-confirm-form")).Length(); n != 0 {
		t.Errorf("the replaced challenge's page offers its code form (%q)", text(doc, "cancel-confirm"))
	}
	if doc.Find(testid("challenge-dead")).Length() == 0 {
		t.Errorf("the replaced challenge's page does not say it can no longer be used")
	}
	doc = page(t, sup.get("/payments/"+s.ID), http.StatusOK)
	if n := doc.Find(testid("enter-code")).Length(); n != 1 {
		t.Errorf("challenge rows offering \"Enter code\" = %d, want 1 (only the newest code is live)", n)
	}
}

// The code form tells support how many attempts are left counting the payment's budget too (10
// wrong codes a day across all its codes): after 9 wrong codes a fresh code's form said "5
// attempts left" while the next wrong code locked every code of the payment for a day (an
// outside review).
func TestCodeFormCountsThePaymentsWrongCodes(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	ctx := context.Background()
	s := b.payment(t, "o-review-attempts", 1500)
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")

	wrongCodes(t, b, s.ID, payments.CodeGuessesPerDay-1, 5)
	rec := sup.post("/payments/"+s.ID+"/cancel", cancelForm())
	doc := page(t, sup.follow(rec), http.StatusOK)
	form := text(doc, "cancel-confirm")
	t.Logf("the code form says: %q", form)
	if !strings.Contains(form, "1 attempts left") {
		// What the next wrong code really does:
		u, _ := url.Parse(rec.Header().Get("Location"))
		_, err := b.svc.ConfirmCancel(ctx, shop, s.ID, u.Query().Get("challenge"), "wrong!")
		t.Errorf("the form does not say 1 attempt is left, and the next wrong code answers: %v", err)
	}
}

// Once a payment has 10 wrong codes within a day "every confirmation, the right code too, and
// every new code request answers 429 with Retry-After" (docs/api.md): a confirmation of a
// replaced (or expired) code of a locked payment answered 410 "request a new one", sending the
// client to a request that is refused (an outside review).
func TestLockedPaymentAnswersItsLockForADeadCode(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	ctx := context.Background()
	s := b.payment(t, "o-review-locked-410", 1500)
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	first, err := b.svc.RequestCancel(ctx, shop, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.lockCodes(t, s.ID) // asks for new codes itself: first is replaced
	_, err = b.svc.ConfirmCancel(ctx, shop, s.ID, first.ID, "123456")
	if payments.ErrorCode(err) != payments.ELOCKED {
		t.Errorf("confirming a replaced code of a locked payment = %v (code %s), want %s with Retry-After", err, payments.ErrorCode(err), payments.ELOCKED)
	}
	_, rerr := b.svc.RequestCancel(ctx, shop, s.ID)
	t.Logf("and the new code it tells the client to request: %v", rerr)
}

// The code form names where the code went: a payment created without a contact of its own gets
// its codes at the order's contact (as the message is addressed), and the form said "the
// customer ()" (an outside review).
func TestCodeFormNamesTheOrdersContact(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	ctx := context.Background()
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	first := b.payment(t, "o-contact-order", 1500) // the order's contact: cust@example.com
	b.gw.SetStatus(first.GatewayPaymentID, payments.GatewayDeclined)
	if got, err := b.svc.Check(ctx, shop, first.ID); err != nil || got.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", got.Status, err)
	}
	res, err := b.svc.Create(ctx, shop, payments.CreateInput{OrderID: "o-contact-order", Amount: 1500, Currency: "EUR"})
	if err != nil || res.Session.CustomerContact != "" {
		t.Fatalf("second payment without a contact: %+v %v", res.Session, err)
	}
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	doc := page(t, sup.follow(sup.post("/payments/"+res.Session.ID+"/cancel", cancelForm())), http.StatusOK)
	if form := text(doc, "cancel-confirm"); !strings.Contains(form, "(cust@example.com)") {
		t.Fatalf("the code form says %q, want the order's contact the code went to", form)
	}
}

// A payment whose codes are locked offers no code form: the form of an open code still said
// "0 attempts left" and took a code that is refused whatever it is, beside the panel saying the
// codes are locked (an outside review). It says the lock instead.
func TestLockedPaymentOffersNoCodeForm(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	s := b.payment(t, "o-review-locked-form", 1500)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("sup@example.com")
	ch := wrongCodes(t, b, s.ID, payments.CodeGuessesPerDay, 4) // three codes: the last has had two wrong guesses and is still open
	doc := page(t, sup.get("/payments/"+s.ID+"?challenge="+ch.ID), http.StatusOK)
	if doc.Find(testid("cancel-confirm-form")).Length() != 0 || doc.Find(testid("challenge-locked")).Length() != 1 {
		t.Fatalf("the open code of a locked payment: %q", text(doc, "cancel-confirm"))
	}
}

// wrongCodes makes n wrong guesses at the payment's cancel codes as the shop, asking for a new
// code before every per-th guess, and returns the last code asked for.
func wrongCodes(t *testing.T, b *consoleBench, sessionID string, n, per int) payments.Challenge {
	t.Helper()
	ctx := context.Background()
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	var ch payments.Challenge
	for i := range n {
		if i%per == 0 {
			var err error
			if ch, err = b.svc.RequestCancel(ctx, shop, sessionID); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.svc.ConfirmCancel(ctx, shop, sessionID, ch.ID, "wrong!"); payments.ErrorCode(err) != payments.EWRONG {
			t.Fatalf("wrong guess %d = %v", i+1, err)
		}
	}
	return ch
}
