package access_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"pitlane/access"
	"pitlane/payments"
)

// TestUserChanges: disable, another role, a new password: each audited in its transaction, with
// what the contract promises (a disabled user cannot sign in; a new password ends sessions,
// which the console sees as a new session epoch, and lifts a lockout).
func TestUserChanges(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.user(t, "root@example.com", access.RoleAdmin)
	ana := b.user(t, "ana@example.com", access.RoleSupport)
	by := payments.Staff{Email: "root@example.com", Role: "admin"}
	audits := func(action string) int {
		return b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = 'ana@example.com' AND actor = 'root@example.com'`, action)
	}

	u, err := b.acc.SetRole(ctx, by, "Ana@Example.com", access.RoleFinance)
	if err != nil || u.Role != access.RoleFinance || audits(payments.AuditUserRole) != 1 {
		t.Fatalf("role: %+v %v, %d audit rows", u, err, audits(payments.AuditUserRole))
	}
	if _, err := b.acc.SetRole(ctx, by, "ana@example.com", "boss"); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("unknown role: %v", err)
	}

	// Lock her out, then give her a new password: the lock is lifted, the old password is dead,
	// the session epoch moved on.
	for range access.DefaultLimits.AccountFailures {
		b.acc.SignIn(ctx, attempt("ana@example.com", "guess guess guess", "192.0.2.1")) //nolint:errcheck
	}
	if _, err := b.acc.SetPassword(ctx, by, "ana@example.com", "short"); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("short password: %v", err)
	}
	u, err = b.acc.SetPassword(ctx, by, "ana@example.com", "a brand new password")
	if err != nil || u.SessionEpoch != ana.SessionEpoch+1 || audits(payments.AuditUserPassword) != 1 {
		t.Fatalf("password: %+v %v", u, err)
	}
	if _, err := b.acc.SignIn(ctx, attempt("ana@example.com", testPassword, "198.51.100.1")); payments.ErrorCode(err) != payments.EWRONG {
		t.Fatalf("the old password: %v", err)
	}
	if _, err := b.acc.SignIn(ctx, attempt("ana@example.com", "a brand new password", "198.51.100.1")); err != nil {
		t.Fatalf("the new password: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE detail LIKE '%brand new%'`); n != 0 {
		t.Fatal("the password is in the audit log")
	}

	u, err = b.acc.DisableUser(ctx, by, "ana@example.com")
	if err != nil || !u.Disabled() || audits(payments.AuditUserDisable) != 1 {
		t.Fatalf("disable: %+v %v", u, err)
	}
	first := *u.DisabledAt
	b.clock.Advance(time.Hour)
	if u, err = b.acc.DisableUser(ctx, by, "ana@example.com"); err != nil || !u.DisabledAt.Equal(first) {
		t.Fatalf("disable twice: %+v %v (the first time stays)", u, err)
	}
	if _, err := b.acc.SignIn(ctx, attempt("ana@example.com", "a brand new password", "198.51.100.1")); payments.ErrorCode(err) != payments.EWRONG {
		t.Fatalf("disabled user signed in: %v", err)
	}
	for _, f := range []func() error{
		func() error { _, err := b.acc.DisableUser(ctx, by, "nobody@example.com"); return err },
		func() error { _, err := b.acc.SetRole(ctx, by, "nobody@example.com", access.RoleAdmin); return err },
		func() error {
			_, err := b.acc.SetPassword(ctx, by, "nobody@example.com", "long enough password")
			return err
		},
	} {
		if err := f(); payments.ErrorCode(err) != payments.ENOTFOUND {
			t.Errorf("unknown user: %v", err)
		}
	}
}

// TestLastAdmin: the last enabled admin can be neither disabled nor given another role; with a
// second admin either can go; a disabled admin does not count.
func TestLastAdmin(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.user(t, "a1@example.com", access.RoleAdmin)
	b.user(t, "s1@example.com", access.RoleSupport)
	if _, err := b.acc.DisableUser(ctx, cli, "a1@example.com"); payments.ErrorCode(err) != payments.ECONFLICT ||
		!strings.Contains(payments.ErrorMessage(err), "last admin") {
		t.Fatalf("disable the last admin: %v", err)
	}
	if _, err := b.acc.SetRole(ctx, cli, "a1@example.com", access.RoleSupport); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("demote the last admin: %v", err)
	}
	if _, err := b.acc.SetRole(ctx, cli, "a1@example.com", access.RoleAdmin); err != nil {
		t.Fatalf("the last admin stays admin: %v", err)
	}
	if _, err := b.acc.SetRole(ctx, cli, "s1@example.com", access.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	if _, err := b.acc.DisableUser(ctx, cli, "a1@example.com"); err != nil {
		t.Fatalf("with another admin: %v", err)
	}
	if _, err := b.acc.DisableUser(ctx, cli, "s1@example.com"); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("the remaining admin (the other is disabled): %v", err)
	}
}

// TestLastAdminRace: two admins disable each other at the same moment. Both statements are made
// to wait on the admins' rows (a third transaction holds them) and are released together: the
// row locks serialise them, and the second sees the first's change, so exactly one succeeds and
// one admin remains.
//
// Negative control: the naive rule (count the enabled admins, then update, no lock) under the
// same meeting point lets both through and leaves no admin.
func TestLastAdminRace(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.user(t, "a1@example.com", access.RoleAdmin)
	b.user(t, "a2@example.com", access.RoleAdmin)

	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT id FROM staff_users WHERE role = 'admin' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for _, email := range []string{"a1@example.com", "a2@example.com"} {
		by := payments.Staff{Email: map[string]string{"a1@example.com": "a2@example.com", "a2@example.com": "a1@example.com"}[email], Role: "admin"}
		go func() {
			_, err := b.acc.DisableUser(ctx, by, email)
			errs <- err
		}()
	}
	waitLockWaiters(t, b, 2)
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for range 2 {
		got[payments.ErrorCode(<-errs)]++
	}
	if got[""] != 1 || got[payments.ECONFLICT] != 1 {
		t.Fatalf("outcomes %v, want one success and one conflict", got)
	}
	if n := b.count(t, `SELECT count(*) FROM staff_users WHERE role = 'admin' AND disabled_at IS NULL`); n != 1 {
		t.Fatalf("%d enabled admins left, want 1", n)
	}

	// Negative control.
	c := newBench(t)
	c.user(t, "a1@example.com", access.RoleAdmin)
	c.user(t, "a2@example.com", access.RoleAdmin)
	var counted sync.WaitGroup
	counted.Add(2)
	done := make(chan error, 2)
	for _, email := range []string{"a1@example.com", "a2@example.com"} {
		go func() {
			tx, err := c.pool.Begin(ctx)
			if err != nil {
				done <- err
				return
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			var admins int
			err = tx.QueryRow(ctx, `SELECT count(*) FROM staff_users WHERE role = 'admin' AND disabled_at IS NULL`).Scan(&admins)
			counted.Done()
			counted.Wait() // both have counted before either writes
			if err == nil && admins > 1 {
				_, err = tx.Exec(ctx, `UPDATE staff_users SET disabled_at = now() WHERE email = $1`, email)
			}
			if err == nil {
				err = tx.Commit(ctx)
			}
			done <- err
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n := c.count(t, `SELECT count(*) FROM staff_users WHERE role = 'admin' AND disabled_at IS NULL`); n != 0 {
		t.Fatalf("negative control: the naive rule left %d admins; the meeting point did not happen", n)
	}
}

// waitLockWaiters waits until n backends wait for a row lock (pg_locks not granted): how the
// test knows both changes are blocked exactly where the rule says they must be.
func waitLockWaiters(t *testing.T, b *bench, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var waiting int
		if err := b.pool.QueryRow(context.Background(),
			`SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> pg_backend_pid()`).Scan(&waiting); err != nil {
			t.Fatalf("pg_locks: %v", err)
		}
		if waiting >= n {
			return
		}
	}
	t.Fatalf("no %d backends ever waited for a lock", n)
}

// A password nobody could type at the sign-in form (NUL, other control characters, bytes that
// are not UTF-8) is refused: set by an admin, it would lock the user out (an outside audit set 13
// NUL bytes).
func TestPasswordMustBeTypable(t *testing.T) {
	t.Parallel()
	for _, pw := range []string{strings.Repeat("\x00", 13), "long-enough-pass\x1b", "long-enough-\xff\xfe"} {
		if err := access.ValidatePassword(pw); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("ValidatePassword(%q) = %v, want invalid", pw, err)
		}
	}
	if err := access.ValidatePassword("correct horse battery staple ü"); err != nil {
		t.Fatal(err)
	}
}

// TestPasswordSetByIsRecorded: a password a console user set for someone else (creating the user
// or replacing the password) records who, because they know it (the second-person rules in
// package payments treat the two accounts as one person); the command line and the owner record
// nobody, and a password set from the command line clears it.
func TestPasswordSetByIsRecorded(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	admin := payments.Staff{Email: "Root@Example.com", Role: string(access.RoleAdmin)}
	setBy := func(email string) string {
		t.Helper()
		var by *string
		if err := b.pool.QueryRow(ctx, `SELECT password_set_by FROM staff_users WHERE email = $1`, email).Scan(&by); err != nil {
			t.Fatal(err)
		}
		if by == nil {
			return ""
		}
		return *by
	}
	if _, err := b.acc.CreateUser(ctx, admin, "ana@example.com", access.RoleFinance, testPassword); err != nil {
		t.Fatal(err)
	}
	if got := setBy("ana@example.com"); got != "root@example.com" {
		t.Fatalf("created in the console by an admin: set by %q", got)
	}
	if _, err := b.acc.SetPassword(ctx, cli, "ana@example.com", testPassword+"2"); err != nil {
		t.Fatal(err)
	}
	if got := setBy("ana@example.com"); got != "" {
		t.Fatalf("replaced from the command line: set by %q, want nobody", got)
	}
	if _, err := b.acc.SetPassword(ctx, admin, "ana@example.com", testPassword+"3"); err != nil {
		t.Fatal(err)
	}
	if got := setBy("ana@example.com"); got != "root@example.com" {
		t.Fatalf("replaced in the console by an admin: set by %q", got)
	}
	// The owner setting their own keeps the setter: it could be the admin at the keyboard, who
	// would otherwise erase the link they are bound by.
	if _, err := b.acc.SetPassword(ctx, payments.Staff{Email: "ana@example.com", Role: string(access.RoleFinance)}, "ana@example.com", testPassword+"4"); err != nil {
		t.Fatal(err)
	}
	if got := setBy("ana@example.com"); got != "root@example.com" {
		t.Fatalf("replaced by its owner: set by %q, want root@example.com kept", got)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND detail LIKE '%knows it%'`, payments.AuditUserPassword); n != 1 {
		t.Fatalf("%d audit entries saying who knows the password, want 1", n)
	}
	if _, err := b.acc.CreateUser(ctx, cli, "bo@example.com", access.RoleSupport, testPassword); err != nil {
		t.Fatal(err)
	}
	if got := setBy("bo@example.com"); got != "" {
		t.Fatalf("created from the command line: set by %q", got)
	}
}

// An email with a character nobody sees, or in another Unicode form of an existing one, was a
// second account that looked like the first in every list — root@example.com with a zero-width
// space stayed an enabled admin when root@example.com was offboarded (an outside review). Such
// an email is refused, a decomposed one is the composed one; a password holding a byte-order
// mark or another character no keyboard types is refused (nobody could sign in with it), while
// the joiners that are typed (emoji, Persian) are not.
func TestLookalikeEmailsAndUntypablePasswords(t *testing.T) {
	t.Parallel()
	for _, e := range []string{"root@example.com\u200b", "root\u200b@example.com", "ro\u202eot@example.com", "\ufeffroot@example.com",
		"root\u2028@example.com", "root\ue000@example.com"} { // a line separator, a private-use character
		if err := access.ValidateEmail(access.NormalizeEmail(e)); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("email %q: %v, want refused", e, err)
		}
	}
	if got, want := access.NormalizeEmail("Jose\u0301@Example.com"), "jos\u00e9@example.com"; got != want {
		t.Errorf("NormalizeEmail of a decomposed é: %q, want %q", got, want)
	}
	for _, pw := range []string{"\ufeffa long enough password", "a long\u200b enough password", "a long enough\u200e password"} {
		if err := access.ValidatePassword(pw); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("password %q: %v, want refused", pw, err)
		}
	}
	for _, pw := range []string{"a long enough password 👩\u200d💻", "گذرواژه\u200cی بلند کافی"} {
		if err := access.ValidatePassword(pw); err != nil {
			t.Errorf("password %q: %v, want taken", pw, err)
		}
	}
}

// TestNormalizeEmailIsStable: normalizing a normalized email changes nothing. Composing before
// lower-casing alone stored "MARİ́A@x" as "mari" and a combining accent (lower-casing "İ" undoes
// its composition), which the next look-up composed into another account's "maría@x" (an
// outside review). Every capital letter before every combining diacritical mark.
func TestNormalizeEmailIsStable(t *testing.T) {
	t.Parallel()
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !unicode.IsUpper(r) && !unicode.IsTitle(r) {
			continue
		}
		for m := rune(0x300); m < 0x370; m++ {
			once := access.NormalizeEmail(string(r) + string(m) + "a@example.com")
			if twice := access.NormalizeEmail(once); twice != once {
				t.Errorf("NormalizeEmail(%+q) = %+q, and again %+q", string(r)+string(m), once, twice)
			}
		}
	}
}
