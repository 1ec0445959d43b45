package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// docs/console.md, "One-time codes in the console": "the person who types the codes in does not
// reset their own budget". An admin both types codes in (PermOperate) and unlocks (PermResolve):
// one admin typed the payment's ten wrong codes of the day, unlocked them and typed ten more.
// The unlock is refused to them (403) and allowed to another admin; the guesses it clears are
// marked cleared. Outside review (codes and access); fails without guessed_by and the check in
// UnlockCodes.
func TestAnAdminDoesNotUnlockWrongCodesTheyTypedThemselves(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	admin := payments.Staff{Email: "admin@example.com", Role: "admin"}
	sess := b.registered(t, "o-admin-own-unlock", 1000)

	guess := func(round int) {
		var ch payments.Challenge
		var code string
		for i := range payments.CodeGuessesPerDay {
			if i%5 == 0 {
				var err error
				if ch, err = b.svc.RequestCancel(ctx, admin.Actor(), sess.ID); err != nil {
					t.Fatalf("round %d: request: %v", round, err)
				}
				code = b.lastCode(t, sess.ID)
			}
			if _, err := b.svc.ConfirmCancel(ctx, admin.Actor(), sess.ID, ch.ID, otherCode(code)); payments.ErrorCode(err) != payments.EWRONG {
				t.Fatalf("round %d: the admin's wrong guess %d = %v", round, i+1, err)
			}
			b.clock.Advance(time.Minute)
		}
	}
	guess(1)
	if _, err := b.svc.UnlockCodes(ctx, admin, sess.ID, "customer verified"); payments.ErrorCode(err) != payments.EFORBIDDEN {
		t.Fatalf("the admin who typed the %d wrong codes unlocks them: %v; want forbidden", payments.CodeGuessesPerDay, err)
	}
	other := payments.Staff{Email: "admin2@example.com", Role: "admin"}
	if n, err := b.svc.UnlockCodes(ctx, other, sess.ID, "customer verified by phone"); err != nil || n != payments.CodeGuessesPerDay {
		t.Fatalf("another admin unlocks: %d cleared, %v", n, err)
	}
}
