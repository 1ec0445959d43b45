package access_test

import (
	"context"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// TestEnableUserLetsThemBackIn: a user disabled by mistake (or back from leave) is enabled again
// and signs in with the password they had, a lockout earned while disabled lifted; the sessions
// and trusted devices the disable ended stay ended, each change is audited, enabling twice changes nothing, an unknown email is not
// found, and an admin whose own session no longer stands enables nobody.
func TestEnableUserLetsThemBackIn(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.user(t, "root@example.com", access.RoleAdmin)
	ana := b.user(t, "ana@example.com", access.RoleSupport)
	by := payments.Staff{Email: "root@example.com", Role: "admin"}
	audit := func(detail string) int {
		return b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = 'ana@example.com' AND detail LIKE $2`,
			payments.AuditUserEnable, detail+"%")
	}
	if _, err := b.acc.RememberDevice(ctx, ana, ""); err != nil {
		t.Fatal(err)
	}
	disabled, err := b.acc.DisableUser(ctx, by, "ana@example.com")
	if err != nil || disabled.SessionEpoch != ana.SessionEpoch+1 {
		t.Fatalf("disable: %+v %v", disabled, err)
	}

	// Sign-in failures while disabled (someone trying her password) are lifted with the enable.
	for range access.DefaultLimits.AccountFailures {
		b.acc.SignIn(ctx, attempt("ana@example.com", "guess guess guess", "192.0.2.1")) //nolint:errcheck
	}
	// The session epoch moves on again: no console session from before the enable stands (one
	// a release before disabled without moving the epoch kept ana's).
	if _, err := b.pool.Exec(ctx, `UPDATE staff_users SET session_epoch = $2 WHERE email = $1`, "ana@example.com", ana.SessionEpoch); err != nil {
		t.Fatal(err)
	}
	u, err := b.acc.EnableUser(ctx, by, "Ana@Example.com")
	if err != nil || u.Disabled() || u.SessionEpoch == ana.SessionEpoch || audit("enabled") != 1 {
		t.Fatalf("enable: %+v %v, %d audit rows", u, err, audit("enabled"))
	}
	if _, err := b.acc.SignIn(ctx, attempt("ana@example.com", testPassword, "198.51.100.1")); err != nil {
		t.Fatalf("the enabled user signs in with her password: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM staff_devices WHERE email = 'ana@example.com'`); n != 0 {
		t.Fatalf("%d trusted devices came back with the account", n)
	}
	if u, err := b.acc.EnableUser(ctx, by, "ana@example.com"); err != nil || u.Disabled() || audit("already enabled") != 1 {
		t.Fatalf("enable twice: %+v %v", u, err)
	}
	if _, err := b.acc.EnableUser(ctx, by, "nobody@example.com"); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("unknown user: %v", err)
	}

	// An admin disabled while their "Enable" waited is refused: nothing changes.
	b.user(t, "boss@example.com", access.RoleAdmin)
	if _, err := b.acc.DisableUser(ctx, by, "ana@example.com"); err != nil {
		t.Fatal(err)
	}
	root, err := b.acc.UserNamed(ctx, "root@example.com")
	if err != nil {
		t.Fatal(err)
	}
	rootCtx := payments.WithStaffSession(ctx, "root@example.com", "admin", root.SessionEpoch)
	if _, err := b.acc.DisableUser(ctx, payments.Staff{Email: "boss@example.com", Role: "admin"}, "root@example.com"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.acc.EnableUser(rootCtx, by, "ana@example.com"); err == nil {
		t.Fatal("an offboarded admin enabled a user")
	}
	if u, err := b.acc.UserNamed(ctx, "ana@example.com"); err != nil || !u.Disabled() {
		t.Fatalf("ana after the refused enable: %+v %v", u, err)
	}
}
