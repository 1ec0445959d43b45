package payments_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"golang.org/x/crypto/bcrypt"

	"pitlane/access"
	"pitlane/payments"
)

// Outside review (four-eyes): the second-person rule is judged on who knows the accounts' passwords at
// approval time only. An admin who created a finance user (and so knows its password: "they
// count as this user for the second-person rules", says the audit entry) signs in as that user
// and proposes. Later a second admin resets that user's password in a routine reset (the owner
// asks for one): password_set_by now names the second admin, and the first admin approves the
// proposal they made themselves. The proposal was made while the two accounts were one person.
func TestALinkAtProposalTimeOutlivesAPasswordReset(t *testing.T) {
	t.Parallel()
	for _, resetBy := range []string{"y-admin@example.com", "cli:root"} {
		t.Run(resetBy, func(t *testing.T) { t.Parallel(); linkedThenReset(t, resetBy) })
	}
}

func linkedThenReset(t *testing.T, resetBy string) {
	b := newBench(t)
	ctx := context.Background()
	acc, x, y := twoAdmins(t, b)
	// X creates the finance user: X knows its password.
	if _, err := acc.CreateUser(ctx, x, "fin-b@example.com", access.RoleFinance, "initial password 1"); err != nil {
		t.Fatal(err)
	}
	finB := payments.Staff{Email: "fin-b@example.com", Role: "finance"}

	// X, signed in as fin-b, proposes.
	s := b.flagged(t, "o-linked-then-reset", 4200)
	p := b.propose(t, finB, s.ID, payments.StatusCompleted)

	// Control: right now X is refused.
	_, err := b.svc.ApproveResolution(ctx, x, p.ID)
	wantCode(t, err, payments.EFORBIDDEN, "set the other's password")

	// A routine reset by another admin (fin-b forgot the password).
	// (or, as the refusal's own message advises, "the account's owner gets a password set from
	// the command line")
	by := y
	if resetBy != y.Email {
		by = payments.Staff{Email: resetBy, Role: "admin"} // the command line
	}
	if _, err := acc.SetPassword(ctx, by, finB.Email, "brand new password 2"); err != nil {
		t.Fatal(err)
	}

	// X approves the proposal X made as fin-b.
	a, err := b.svc.ApproveResolution(ctx, x, p.ID)
	if err == nil {
		t.Fatalf("the admin who knew fin-b's password when fin-b's proposal was made approved it: proposal %s, payment %s, proposed by %s, approved by %s",
			a.State, a.SessionStatus, a.ProposedBy, a.DecidedBy)
	}
	wantCode(t, err, payments.EFORBIDDEN, "when fin-b@example.com made this proposal")
}

// The same gap for one-time codes: an admin who set another admin account's password read a
// code in the outbox as that account; once that password was reset, the admin confirmed the code
// as themselves. The link as it was at reading is kept with the code (seen_by_setters).
func TestACodeReadThroughALinkedAccountStaysReadAfterAReset(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	x := payments.Staff{Email: "x-admin@example.com", Role: "admin"}
	z := payments.Staff{Email: "z-admin@example.com", Role: "admin"}
	b.passwordSetBy(t, z, x.Email) // X created Z: X knows Z's password
	p := b.registered(t, "o-code-linked-then-reset", 1000)
	cc, err := b.svc.RequestCancel(ctx, api, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, p.ID)
	if _, err := b.svc.Outbox(ctx, z, ""); err != nil { // X, signed in as Z, reads the code
		t.Fatal(err)
	}
	b.exec(t, `UPDATE staff_users SET password_set_by = NULL WHERE email = $1`, z.Email) // reset from the command line
	_, err = b.svc.ConfirmCancel(ctx, x.Actor(), p.ID, cc.ID, code)
	wantCode(t, err, payments.EFORBIDDEN, "when this code was read in the outbox, you had set the reader's password")
	if got, _ := b.svc.Get(ctx, p.ID); got.Status != payments.StatusRegistered {
		t.Fatalf("the payment is %s after a refused confirmation", got.Status)
	}
}

// Outside review (four-eyes, a chain): X creates admin B (X knows B's password), signs in as B and
// creates finance user D (X knows D's password too). Another admin, or the command line, then
// resets B's password: D's password is untouched and X still knows it, but the chain walked as
// the passwords are now (D <- B <- the resetter) no longer reached X, and X approved, as D, the
// refund over the direct limit X had proposed. Who knows a password is decided when it is set
// (staff_users.password_known_by, migration 00890): the reset of B takes nobody out of D's.
// Negative control: password_linked walking the setters as they are now (00710's) approves.
func TestAChainOfSettersOutlivesAResetOfItsMiddle(t *testing.T) {
	t.Parallel()
	for _, resetBy := range []string{"y-admin@example.com", "cli:root"} {
		t.Run(resetBy, func(t *testing.T) {
			t.Parallel()
			b := newBench(t, eurLimit)
			ctx := context.Background()
			acc, x, _ := twoAdmins(t, b)
			middle := payments.Staff{Email: "b-admin@example.com", Role: "admin"}
			if _, err := acc.CreateUser(ctx, x, middle.Email, access.RoleAdmin, "initial password b"); err != nil {
				t.Fatal(err)
			}
			d := payments.Staff{Email: "fin-d@example.com", Role: "finance"} // created by X at B's keyboard
			if _, err := acc.CreateUser(ctx, middle, d.Email, access.RoleFinance, "initial password d"); err != nil {
				t.Fatal(err)
			}
			if _, err := acc.SetPassword(ctx, payments.Staff{Email: resetBy, Role: "admin"}, middle.Email, "brand new password b2"); err != nil {
				t.Fatal(err)
			}

			s := b.completed(t, "o-chain-reset", 100000)
			p, err := b.svc.RefundByFinance(ctx, x, staffRefund(s.ID, 90000, uuid.NewString()))
			if err != nil || p.Proposal == nil {
				t.Fatalf("proposal = %+v %v", p, err)
			}
			a, err := b.svc.ApproveResolution(ctx, d, p.Proposal.ID)
			if err == nil {
				t.Fatalf("X approved X's own refund as D, whose password X set at B's keyboard: %s by %s, approved by %s",
					a.State, a.ProposedBy, a.DecidedBy)
			}
			wantCode(t, err, payments.EFORBIDDEN, "")
			if n := b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1`, s.ID); n != 0 {
				t.Fatalf("%d refunds made", n)
			}
		})
	}
}

// twoAdmins creates the admins X and Y from the command line (no console user knows their
// passwords) and returns the access service that did, at bcrypt's least cost.
func twoAdmins(t *testing.T, b *bench) (acc *access.Service, x, y payments.Staff) {
	t.Helper()
	acc = access.New(b.pool, b.clock)
	acc.PasswordCost = bcrypt.MinCost
	x = payments.Staff{Email: "x-admin@example.com", Role: "admin"}
	y = payments.Staff{Email: "y-admin@example.com", Role: "admin"}
	for _, a := range []payments.Staff{x, y} {
		if _, err := acc.CreateUser(context.Background(), payments.Staff{Email: "cli:root", Role: "admin"}, a.Email, access.RoleAdmin, "a long enough password"); err != nil {
			t.Fatal(err)
		}
	}
	return acc, x, y
}
