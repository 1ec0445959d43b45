package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// docs/console.md, "One-time codes in the console": an admin does not unlock wrong codes they
// typed themselves, or that someone typed whose password one of them set, the link as it was when
// the code was typed. Admin X created support user S (X knows S's password). X, signed in as S,
// types the payment's ten wrong codes of the day: X's unlock is refused (control). S's password
// is then reset from the command line: X's unlock was let through (it asked password_linked as it
// is at the unlock), and the one person at both keyboards had a second budget of ten guesses on
// the payment that day (an outside review). Each guess now keeps its guesser's setters
// (guesser_setters, migration 00720). Negative control: without that column in UnlockCodes'
// check, X unlocks the ten.
func TestUnlockOfGuessesTypedThroughALinkedAccountAfterAReset(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	x := payments.Staff{Email: "x-admin@example.com", Role: "admin"}
	s := payments.Staff{Email: "sup-s@example.com", Role: "support"}
	b.passwordSetBy(t, x, "")
	b.exec(t, `UPDATE staff_users SET password_set_by = NULL WHERE email = $1`, x.Email)
	b.passwordSetBy(t, s, x.Email) // X created S: X knows S's password
	sess := b.registered(t, "o-unlock-linked-then-reset", 1000)

	var ch payments.Challenge
	var code string
	for i := range payments.CodeGuessesPerDay {
		if i%5 == 0 {
			var err error
			if ch, err = b.svc.RequestCancel(ctx, s.Actor(), sess.ID); err != nil {
				t.Fatalf("request: %v", err)
			}
			code = b.lastCode(t, sess.ID)
		}
		if _, err := b.svc.ConfirmCancel(ctx, s.Actor(), sess.ID, ch.ID, otherCode(code)); payments.ErrorCode(err) != payments.EWRONG {
			t.Fatalf("wrong guess %d as S = %v", i+1, err)
		}
		b.clock.Advance(time.Minute)
	}
	// Control: while X is S's password setter, X may not unlock S's guesses.
	_, err := b.svc.UnlockCodes(ctx, x, sess.ID, "customer verified")
	wantCode(t, err, payments.EFORBIDDEN, "typed some of these wrong codes")

	// A routine reset of S's password from the command line.
	b.exec(t, `UPDATE staff_users SET password_set_by = NULL, session_epoch = session_epoch + 1 WHERE email = $1`, s.Email)

	n, err := b.svc.UnlockCodes(ctx, x, sess.ID, "customer verified")
	if err == nil {
		t.Fatalf("after S's password was reset, X unlocked %d wrong codes typed as S while X knew S's password", n)
	}
	wantCode(t, err, payments.EFORBIDDEN, "")
}
