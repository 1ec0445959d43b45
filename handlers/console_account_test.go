package handlers_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/alexedwards/scs/v2"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/web/auth"
)

// TestConsoleChangeOwnPassword: any staff user changes their own password on /account. The
// current password is proven like a sign-in (a wrong one is counted towards the account's
// lockout and audited); the repeat must match; the new password takes over at once; the user
// stays signed in here and every other session of theirs ends.
func TestConsoleChangeOwnPassword(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	const newPassword = "a much longer new secret"
	here, elsewhere := b.agent(t), b.agent(t)
	here.login("sup@example.com")
	elsewhere.login("sup@example.com")

	doc := page(t, here.get("/account"), http.StatusOK)
	wantText(t, doc, "account-email", "sup@example.com")
	wantText(t, doc, "account-role", "support")
	wantText(t, doc, "account-idle", "after 30 minutes without a request of yours")

	change := func(current, next, repeat string) string {
		t.Helper()
		rec := here.post("/account/password", url.Values{"current_password": {current}, "password": {next}, "password_repeat": {repeat}})
		d := page(t, here.follow(rec), http.StatusOK)
		if msg := text(d, "flash-error"); msg != "" {
			return msg
		}
		return text(d, "flash")
	}
	if msg := change("not my password", newPassword, newPassword); msg != "your current password is not the one you typed" {
		t.Fatalf("a wrong current password: %q", msg)
	}
	if n := b.count(t, `SELECT count(*) FROM staff_login_throttle WHERE email = 'sup@example.com'`); n != 1 {
		t.Fatalf("a wrong current password was not counted towards the lockout (%d throttle rows)", n)
	}
	if n := b.audits(t, payments.AuditLoginFailed, "sup@example.com"); n != 1 {
		t.Fatalf("a wrong current password: %d login_failed entries, want 1", n)
	}
	if msg := change(testPassword, newPassword, newPassword+"x"); msg != "The new password and its repeat differ; nothing was changed." {
		t.Fatalf("a repeat that differs: %q", msg)
	}
	if msg := change(testPassword, "short", "short"); !strings.Contains(msg, "at least 12 characters") {
		t.Fatalf("a short new password: %q", msg)
	}
	if n := b.audits(t, payments.AuditUserPassword, "sup@example.com"); n != 0 {
		t.Fatalf("refused changes wrote %d user.password entries", n)
	}
	if _, err := b.access.SignIn(context.Background(), access.Attempt{Email: "sup@example.com", Password: testPassword}); err != nil {
		t.Fatalf("after refused changes the password must be the old one: %v", err)
	}

	logins := b.audits(t, payments.AuditLogin, "sup@example.com")
	if msg := change(testPassword, newPassword, newPassword); msg != "Your password is changed. Your sessions elsewhere are signed out." {
		t.Fatalf("the change: %q", msg)
	}
	if n := b.audits(t, payments.AuditLogin, "sup@example.com"); n != logins {
		t.Fatalf("proving the password for the change wrote %d sign-in entries", n-logins)
	}
	if rec := here.get("/payments"); rec.Code != http.StatusOK {
		t.Fatalf("the session that changed the password: %d, want it still signed in", rec.Code)
	}
	if rec := elsewhere.get("/payments"); rec.Code != http.StatusSeeOther {
		t.Fatalf("another session of the user: %d, want it signed out", rec.Code)
	}
	if _, err := b.access.SignIn(context.Background(), access.Attempt{Email: "sup@example.com", Password: testPassword}); payments.ErrorCode(err) != payments.EWRONG {
		t.Fatalf("the old password after the change: %v", err)
	}
	if _, err := b.access.SignIn(context.Background(), access.Attempt{Email: "sup@example.com", Password: newPassword}); err != nil {
		t.Fatalf("the new password: %v", err)
	}
	if n := b.audits(t, payments.AuditUserPassword, "sup@example.com"); n != 1 {
		t.Fatalf("the change wrote %d user.password entries, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = 'sup@example.com' AND actor = 'sup@example.com'`, payments.AuditUserPassword); n != 1 {
		t.Fatal("the user.password entry does not name the user as its actor")
	}
}

// TestConsoleSignOutEverywhereElse: "Sign out everywhere else" on /account ends every other
// session of the user at its next request and keeps this one; another user's sessions stay;
// the audit log has it.
func TestConsoleSignOutEverywhereElse(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.user(t, "sup@example.com", access.RoleSupport)
	here, elsewhere, colleague := b.agent(t), b.agent(t), b.agent(t)
	here.login("fin@example.com")
	elsewhere.login("fin@example.com")
	colleague.login("sup@example.com")

	page(t, here.get("/account"), http.StatusOK)
	d := page(t, here.follow(here.post("/account/sessions", nil)), http.StatusOK)
	wantText(t, d, "flash", "You are signed out everywhere else.")
	if rec := here.get("/finance/ledger"); rec.Code != http.StatusOK {
		t.Fatalf("the session that asked: %d, want it still signed in", rec.Code)
	}
	if rec := elsewhere.get("/payments"); rec.Code != http.StatusSeeOther {
		t.Fatalf("the user's other session: %d, want it signed out", rec.Code)
	}
	if rec := colleague.get("/payments"); rec.Code != http.StatusOK {
		t.Fatalf("another user's session: %d, want it untouched", rec.Code)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND actor = 'fin@example.com' AND target = 'fin@example.com'`, payments.AuditUserSessions); n != 1 {
		t.Fatalf("%d %s entries, want 1", n, payments.AuditUserSessions)
	}
}

// "Sign out everywhere else" asks for no password, so it keeps the session's absolute
// deadline: a stolen cookie used for it does not live 12 more hours each time (an outside
// review). The session here is aged to one minute before its deadline.
func TestSignOutEverywhereElseKeepsTheDeadline(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	a := b.agent(t)
	a.login("fin@example.com")
	ctx := context.Background()
	key := func() string {
		ck := a.cookie(auth.SessionCookie)
		if ck == nil {
			t.Fatal("no session cookie")
		}
		s := sha256.Sum256([]byte(ck.Value))
		return hex.EncodeToString(s[:])
	}
	deadline := func(k string) time.Time {
		var data []byte
		if err := b.pool.QueryRow(ctx, `SELECT data FROM sessions WHERE token = $1`, k).Scan(&data); err != nil {
			t.Fatal(err)
		}
		d, _, err := (scs.GobCodec{}).Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	var data []byte
	if err := b.pool.QueryRow(ctx, `SELECT data FROM sessions WHERE token = $1`, key()).Scan(&data); err != nil {
		t.Fatal(err)
	}
	_, values, err := (scs.GobCodec{}).Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	near := time.Now().Add(time.Minute).UTC()
	if data, err = (scs.GobCodec{}).Encode(near, values); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE sessions SET data = $2, expiry = $3 WHERE token = $1`, key(), data, near); err != nil {
		t.Fatal(err)
	}
	page(t, a.get("/account"), http.StatusOK)
	if rec := a.post("/account/sessions", nil); rec.Code != http.StatusSeeOther {
		t.Fatalf("sign out everywhere else: %d", rec.Code)
	}
	if got := deadline(key()); got.Sub(near).Abs() > time.Second {
		t.Fatalf("deadline after signing out everywhere else = %s, want the session's own %s", got, near)
	}
}
