package access_test

import (
	"context"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// A change of one's own account is made under the session epoch it was asked with. An admin
// sets a user's password because the account was taken over; a "change your own password"
// proven with the old password just before, its new hash still being made, or a "sign out
// everywhere else" still on its way, commits after the reset. The password change replaced the
// admin's password with one of its own and both started their session again on the newest epoch:
// whoever knew the old password kept the account (an outside review). Both are refused now and
// the admin's password stands. The interleaving is made on purpose: a third transaction holds the
// user's row until the reset and then the own change wait on it (pg_stat_activity), the reset
// first. Negative control: without the epoch check in changeUser the own change commits and the
// admin's password no longer signs in.
func TestAnOwnChangeAskedBeforeAnAdminsResetDoesNotUndoIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		own  func(ctx context.Context, acc *access.Service, u access.User) error
	}{
		{"a new password proven with the old one", func(ctx context.Context, acc *access.Service, u access.User) error {
			_, err := acc.ChangeOwnPassword(ctx, access.Attempt{Email: u.Email, Password: testPassword, Address: "192.0.2.7"},
				u.SessionEpoch, "the taker's own password")
			return err
		}},
		{"sign out everywhere else", func(ctx context.Context, acc *access.Service, u access.User) error {
			_, err := acc.EndSessions(ctx, u.Staff(), u.Email, u.SessionEpoch)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx := context.Background()
			admin := b.user(t, "admin@example.com", access.RoleAdmin)
			victim := b.user(t, "victim@example.com", access.RoleSupport)

			blocker, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Rollback(ctx) //nolint:errcheck
			if _, err := blocker.Exec(ctx, `SELECT 1 FROM staff_users WHERE email = $1 FOR UPDATE`, victim.Email); err != nil {
				t.Fatal(err)
			}
			waiting := func(n int) {
				for {
					var w int
					if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
						WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&w); err != nil {
						t.Fatal(err)
					}
					if w >= n {
						return
					}
				}
			}
			const adminsPassword = "the admin's new password"
			reset := make(chan error, 1)
			go func() {
				_, err := b.acc.SetPassword(ctx, admin.Staff(), victim.Email, adminsPassword)
				reset <- err
			}()
			waiting(1)
			own := make(chan error, 1)
			go func() { own <- tc.own(ctx, b.acc, victim) }()
			waiting(2)
			if err := blocker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-reset; err != nil {
				t.Fatalf("the admin's reset: %v", err)
			}
			if err := <-own; payments.ErrorCode(err) != payments.ECONFLICT {
				t.Errorf("the own change after the reset: %v, want ECONFLICT", err)
			}
			if _, err := b.acc.SignIn(ctx, access.Attempt{Email: victim.Email, Password: adminsPassword, Address: "192.0.2.8"}); err != nil {
				t.Errorf("the admin's password no longer signs in: %v", err)
			}
			if u, _ := b.acc.User(ctx, victim.Email); u.SessionEpoch != victim.SessionEpoch+1 {
				t.Errorf("epoch %d, want the reset's %d alone", u.SessionEpoch, victim.SessionEpoch+1)
			}
		})
	}
}
