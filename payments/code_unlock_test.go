package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// lockCodes spends a payment's guess budget: two codes, CodeGuessesPerDay wrong guesses across
// them, a minute apart. It returns the last code and the customer's right code for it.
func lockCodes(t *testing.T, b *bench, sessionID string) (payments.Challenge, string) {
	t.Helper()
	ctx := context.Background()
	var ch payments.Challenge
	var code string
	for i := range payments.CodeGuessesPerDay {
		if i%5 == 0 {
			var err error
			if ch, err = b.svc.RequestCancel(ctx, api, sessionID); err != nil {
				t.Fatal(err)
			}
			code = b.lastCode(t, sessionID)
		}
		if _, err := b.svc.ConfirmCancel(ctx, api, sessionID, ch.ID, otherCode(code)); payments.ErrorCode(err) != payments.EWRONG {
			t.Fatalf("wrong guess %d = %v", i+1, err)
		}
		b.clock.Advance(time.Minute)
	}
	return ch, code
}

// After CodeGuessesPerDay wrong codes a payment's codes are locked for a day (contract: "then
// 429, and a staff member must act"). A finance user unlocks them with a reason: the guesses are
// cleared (kept, marked), the action is audited, support sends a new code and the customer's
// right code cancels. Without the unlock the same steps stay locked (the first half of the test
// is that control). Unlocking needs a reason and a locked payment.
func TestUnlockCodesAfterTooManyWrongOnes(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-unlock", 1000)
	ch, code := lockCodes(t, b, sess.ID)

	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, code); payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("the right code while locked = %v, want locked", err)
	}
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("a new code while locked = %v, want locked", err)
	}
	d, err := b.svc.PaymentDetail(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.WrongCodes != payments.CodeGuessesPerDay || d.CodesLockedUntil == nil {
		t.Fatalf("the page's lock: %d wrong, until %v", d.WrongCodes, d.CodesLockedUntil)
	}

	fin := payments.Staff{Email: "fin@example.com", Role: "finance"}
	if _, err := b.svc.UnlockCodes(ctx, fin, sess.ID, "  "); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("unlock without a reason = %v, want invalid", err)
	}
	n, err := b.svc.UnlockCodes(ctx, fin, sess.ID, "customer called back from the number on file")
	if err != nil || n != payments.CodeGuessesPerDay {
		t.Fatalf("unlock = %d %v, want %d cleared", n, err, payments.CodeGuessesPerDay)
	}
	if _, err := b.svc.UnlockCodes(ctx, fin, sess.ID, "again"); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("unlocking a payment that is not locked = %v, want conflict", err)
	}
	if got := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1 AND cleared_by = 'fin@example.com'`, sess.ID); got != payments.CodeGuessesPerDay {
		t.Fatalf("cleared guesses kept = %d", got)
	}
	if got := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2 AND actor = 'fin@example.com'`,
		payments.AuditCodesUnlock, sess.ID); got != 1 {
		t.Fatalf("unlock audit rows = %d, want 1", got)
	}

	b.clock.Advance(time.Hour) // the hour's three code requests have lapsed too
	ch, err = b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatalf("a new code after the unlock: %v", err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID)); err != nil {
		t.Fatalf("the right code after the unlock: %v", err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("gateway reverses = %d, want 1", n)
	}
}

// An unlock clears what counts now, not the future: ten more wrong codes lock the payment again.
func TestUnlockedCodesLockAgain(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-unlock-again", 1000)
	lockCodes(t, b, sess.ID)
	if _, err := b.svc.UnlockCodes(ctx, payments.Staff{Email: "admin@example.com", Role: "admin"}, sess.ID, "verified by phone"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Hour)
	lockCodes(t, b, sess.ID)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); payments.ErrorCode(err) != payments.ELOCKED {
		t.Fatalf("a new code after ten more wrong ones = %v, want locked", err)
	}
}
