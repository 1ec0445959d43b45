package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/payments"
)

// A payment whose codes are locked after too many wrong ones says so on its page. Support (who
// types the codes in) sees the lock but no way to lift it; finance unlocks it with a reason
// through the router (CSRF, role), the action is audited, and support can send a new code.
func TestConsoleUnlockCodes(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	ctx := context.Background()
	s := b.payment(t, "o-codes-locked", 1500)
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	for i := range payments.CodeGuessesPerDay {
		if i%5 == 0 {
			if _, err := b.svc.RequestCancel(ctx, shop, s.ID); err != nil {
				t.Fatal(err)
			}
		}
		var chID, body string
		if err := b.pool.QueryRow(ctx, `SELECT c.id::text, o.body FROM cancel_challenges c JOIN outbox o ON o.payment_id = c.session_id
			WHERE c.session_id = $1 AND o.kind = 'cancel_code' ORDER BY c.created_at DESC, o.id DESC LIMIT 1`, s.ID).Scan(&chID, &body); err != nil {
			t.Fatal(err)
		}
		wrong := "000000"
		if m := outboxCodeRe.FindStringSubmatch(body); m != nil && m[1] == wrong {
			wrong = "111111"
		}
		if _, err := b.svc.ConfirmCancel(ctx, shop, s.ID, chID, wrong); payments.ErrorCode(err) != payments.EWRONG {
			t.Fatalf("wrong guess %d = %v", i+1, err)
		}
		b.clock.Advance(time.Minute)
	}

	b.user(t, "sup@example.com", access.RoleSupport)
	b.user(t, "fin@example.com", access.RoleFinance)
	sup, fin := b.agent(t), b.agent(t)
	sup.login("sup@example.com")
	fin.login("fin@example.com")

	doc := page(t, sup.get("/payments/"+s.ID), http.StatusOK)
	wantText(t, doc, "codes-locked", "Codes are locked: 10 wrong codes within a day")
	if n := doc.Find(testid("codes-unlock-form")).Length(); n != 0 {
		t.Fatal("support is offered the unlock")
	}
	// Support's request for a new code is refused meanwhile, saying who can help.
	doc = page(t, sup.follow(sup.post("/payments/"+s.ID+"/cancel", url.Values{})), http.StatusOK)
	wantText(t, doc, "flash-error", "a finance or admin user can unlock them")

	doc = page(t, fin.get("/payments/"+s.ID), http.StatusOK)
	action, form := formValues(doc, "codes-unlock-form")
	form.Set("reason", "customer verified by a call back")
	doc = page(t, fin.follow(fin.post(action, form)), http.StatusOK)
	wantText(t, doc, "flash", "Codes unlocked: 10 wrong codes cleared")
	if doc.Find(testid("codes-locked")).Length() != 0 {
		t.Fatal("the page still says the codes are locked")
	}
	if n := b.audits(t, payments.AuditCodesUnlock, s.ID); n != 1 {
		t.Fatalf("unlock audits = %d, want 1", n)
	}
	// The same form again: nothing is locked any more, and the page says so.
	doc = page(t, fin.follow(fin.post(action, form)), http.StatusOK)
	wantText(t, doc, "flash-error", "are not locked")

	b.clock.Advance(time.Hour)
	doc = page(t, sup.follow(sup.post("/payments/"+s.ID+"/cancel", url.Values{})), http.StatusOK)
	if n := doc.Find(testid("flash-error")).Length(); n != 0 {
		t.Fatalf("a new code after the unlock: %s", text(doc, "flash-error"))
	}
}
