package handlers_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/web"
	"pitlane/web/auth"
)

// userID is the id the users page's forms post to.
func (b *consoleBench) userID(t testing.TB, email string) string {
	t.Helper()
	return strconv.Itoa(b.count(t, `SELECT id FROM staff_users WHERE email = $1`, email))
}

// TestUsersPageChangesUsers: an admin disables a user, changes a role and sets a password from
// the users page (CSRF, audited); the changed user's session ends at their next request where
// the contract says so; the last admin cannot be disabled; only admins may post.
func TestUsersPageChangesUsers(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "root@example.com", access.RoleAdmin)
	b.user(t, "ana@example.com", access.RoleSupport)
	b.user(t, "bo@example.com", access.RoleSupport)
	adm, ana, bo := b.agent(t), b.agent(t), b.agent(t)
	adm.login("root@example.com")
	ana.login("ana@example.com")
	bo.login("bo@example.com")

	doc := page(t, adm.get("/admin/users"), http.StatusOK)
	if n := doc.Find(`[data-testid="user-row"][data-email="ana@example.com"] ` + testid("user-disable-form")).Length(); n != 1 {
		t.Fatalf("no disable form for ana (%d)", n)
	}

	// Role: ana becomes finance, at her next request (no new sign-in).
	rec := adm.post("/admin/users/"+b.userID(t, "ana@example.com")+"/role", url.Values{"role": {"finance"}})
	wantText(t, page(t, adm.follow(rec), http.StatusOK), "flash", "ana@example.com is now finance")
	if rec := ana.get("/finance/cases"); rec.Code != http.StatusOK {
		t.Fatalf("ana as finance: /finance/cases = %d", rec.Code)
	}
	// Password: bo's session ends (whoever knew the old password is out); the new one works.
	rec = adm.post("/admin/users/"+b.userID(t, "bo@example.com")+"/password", url.Values{"password": {"a brand new password"}})
	wantText(t, page(t, adm.follow(rec), http.StatusOK), "flash", "sessions are ended")
	if rec := bo.get("/payments"); rec.Code != http.StatusSeeOther {
		t.Fatalf("bo's session after a new password: %d, want 303 to sign in", rec.Code)
	}
	bo.get("/login")
	if rec := bo.post("/login", url.Values{"email": {"bo@example.com"}, "password": {"a brand new password"}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("bo with the new password: %d", rec.Code)
	}
	// A short password is refused with a message, nothing changes.
	rec = adm.post("/admin/users/"+b.userID(t, "bo@example.com")+"/password", url.Values{"password": {"short"}})
	wantText(t, page(t, adm.follow(rec), http.StatusOK), "flash-error", "at least 12 characters")

	// The admin's own password is /account's (it asks for the current one): a session someone
	// else got hold of cannot lock its owner out from here (an outside review). No form on the
	// admin's own row; a forged post is refused, nothing changes.
	doc = page(t, adm.get("/admin/users"), http.StatusOK)
	if n := doc.Find(`[data-testid="user-row"][data-email="root@example.com"] ` + testid("user-password-form")).Length(); n != 0 {
		t.Fatal("a password form on the admin's own row")
	}
	rec = adm.post("/admin/users/"+b.userID(t, "root@example.com")+"/password", url.Values{"password": {"the thief's own password"}})
	wantText(t, page(t, adm.follow(rec), http.StatusOK), "flash-error", "your account page")
	owner := b.agent(t)
	owner.get("/login")
	if rec := owner.post("/login", url.Values{"email": {"root@example.com"}, "password": {testPassword}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("the owner with their password after the refused change: %d", rec.Code)
	}

	// Disable: ana is out at her next request.
	rec = adm.post("/admin/users/"+b.userID(t, "ana@example.com")+"/disable", nil)
	wantText(t, page(t, adm.follow(rec), http.StatusOK), "flash", "ana@example.com is disabled")
	if rec := ana.get("/"); rec.Code != http.StatusSeeOther {
		t.Fatalf("disabled ana still served: %d", rec.Code)
	}
	// The last admin stays.
	rec = adm.post("/admin/users/"+b.userID(t, "root@example.com")+"/disable", nil)
	wantText(t, page(t, adm.follow(rec), http.StatusOK), "flash-error", "last admin")
	rec = adm.post("/admin/users/"+b.userID(t, "root@example.com")+"/role", url.Values{"role": {"support"}})
	wantText(t, page(t, adm.follow(rec), http.StatusOK), "flash-error", "last admin")

	if n := b.count(t, `SELECT count(*) FROM staff_users WHERE email = 'ana@example.com' AND session_epoch > 0`); n != 1 {
		t.Error("disabling ana left her session epoch: enabling her again by hand would revive her sessions")
	}
	for action, n := range map[string]int{payments.AuditUserRole: 1, payments.AuditUserPassword: 1, payments.AuditUserDisable: 1} {
		if got := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND actor = 'root@example.com' AND role = 'admin'`, action); got != n {
			t.Errorf("%s: %d audit rows, want %d", action, got, n)
		}
	}
	// Without the CSRF token: refused, nothing changes.
	rec = adm.post("/admin/users/"+b.userID(t, "bo@example.com")+"/disable", url.Values{"csrf_token": {""}})
	if rec.Code != http.StatusForbidden || b.count(t, `SELECT count(*) FROM staff_users WHERE disabled_at IS NOT NULL`) != 1 {
		t.Fatalf("disable without CSRF: %d", rec.Code)
	}
	// Not an admin: 403.
	if rec := bo.post("/admin/users/"+b.userID(t, "root@example.com")+"/disable", nil); rec.Code != http.StatusForbidden {
		t.Fatalf("support disables the admin: %d", rec.Code)
	}
	if rec := adm.post("/admin/users/999999/disable", nil); rec.Code != http.StatusNotFound {
		t.Fatalf("unknown user id: %d", rec.Code)
	}

	// Enable: a disabled user's row offers it instead of the other changes; ana signs in again
	// with her password, and her session from before the disable stays ended.
	doc = page(t, adm.get("/admin/users"), http.StatusOK)
	anaRow := `[data-testid="user-row"][data-email="ana@example.com"] `
	if doc.Find(anaRow+testid("user-enable-form")).Length() != 1 || doc.Find(anaRow+testid("user-disable-form")).Length() != 0 {
		t.Fatal("a disabled user's row does not offer Enable (and only that)")
	}
	if rec := bo.post("/admin/users/"+b.userID(t, "ana@example.com")+"/enable", nil); rec.Code != http.StatusForbidden {
		t.Fatalf("support enables a user: %d", rec.Code)
	}
	rec = adm.post("/admin/users/"+b.userID(t, "ana@example.com")+"/enable", url.Values{"csrf_token": {""}})
	if rec.Code != http.StatusForbidden || b.count(t, `SELECT count(*) FROM staff_users WHERE email = 'ana@example.com' AND disabled_at IS NULL`) != 0 {
		t.Fatalf("enable without CSRF: %d", rec.Code)
	}
	rec = adm.post("/admin/users/"+b.userID(t, "ana@example.com")+"/enable", nil)
	wantText(t, page(t, adm.follow(rec), http.StatusOK), "flash", "ana@example.com is enabled")
	if rec := ana.get("/"); rec.Code != http.StatusSeeOther {
		t.Fatalf("ana's session from before the disable served after the enable: %d", rec.Code)
	}
	again := b.agent(t)
	again.get("/login")
	if rec := again.post("/login", url.Values{"email": {"ana@example.com"}, "password": {testPassword}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("enabled ana signs in: %d", rec.Code)
	}
	if got := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND actor = 'root@example.com' AND target = 'ana@example.com'`, payments.AuditUserEnable); got != 1 {
		t.Errorf("enable: %d audit rows, want 1", got)
	}
}

// TestSignInSprayThroughTheRouter: one client tries 40 different emails through the sign-in
// form and gets 429 before the end. A client behind no trusted proxy cannot dodge that by
// sending X-Forwarded-For; behind a trusted proxy, the address the proxy names is what counts.
func TestSignInSprayThroughTheRouter(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "ana@example.com", access.RoleAdmin)
	spray := func(peer string, xff func(i int) string) (firstRefused int) {
		a := b.agent(t)
		a.get("/login")
		for i := 1; i <= 40; i++ {
			form := url.Values{"email": {fmt.Sprintf("staff%02d@example.com", i)}, "password": {"Summer2026!!"}, "csrf_token": {a.csrf}}
			r := newFormRequest("/login", form)
			r.RemoteAddr = peer
			if h := xff(i); h != "" {
				r.Header.Set("X-Forwarded-For", h)
			}
			rec := a.do(r)
			if rec.Code == http.StatusTooManyRequests {
				if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra <= 0 || time.Duration(ra)*time.Second > access.DefaultLimits.AddressWindow+time.Second {
					t.Fatalf("the address throttle's Retry-After = %q, want 1..%v in seconds", rec.Header().Get("Retry-After"), access.DefaultLimits.AddressWindow)
				}
				wantText(t, page(t, rec, http.StatusTooManyRequests), "login-error", "too many failed sign-ins from your network")
				return i
			}
			if rec.Code != http.StatusUnprocessableEntity {
				t.Fatalf("attempt %d: %d", i, rec.Code)
			}
		}
		return 0
	}
	burst := access.DefaultLimits.AddressBurst
	// A made-up X-Forwarded-For per attempt, from a peer nobody trusts: ignored.
	if got := spray("203.0.113.9:40000", func(i int) string { return fmt.Sprintf("198.51.100.%d", i) }); got != burst+1 {
		t.Fatalf("untrusted peer with rotating X-Forwarded-For: first 429 at attempt %d, want %d", got, burst+1)
	}

	// Behind a trusted proxy (TRUSTED_PROXIES=10.0.0.0/8): the client the proxy names counts.
	_, lan, _ := net.ParseCIDR("10.0.0.0/8")
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: b.pool, ReplicaID: "replica-proxied", Payments: b.svc,
		Access: access.New(b.pool, b.clock), SecretKey: []byte("console-test-secret-console-test-secret"), TrustedProxies: []*net.IPNet{lan}})
	b.e = e
	if got := spray("10.0.0.2:40000", func(int) string { return "192.0.2.200" }); got != burst+1 {
		t.Fatalf("one client behind the proxy: first 429 at attempt %d, want %d", got, burst+1)
	}
	// Another client behind the same proxy is not throttled by the first one's failures.
	a := newAgent(t, e)
	a.get("/login")
	r := newFormRequest("/login", url.Values{"email": {"ana@example.com"}, "password": {testPassword}, "csrf_token": {a.csrf}})
	r.RemoteAddr = "10.0.0.2:40001"
	r.Header.Set("X-Forwarded-For", "192.0.2.201")
	if rec := a.do(r); rec.Code != http.StatusSeeOther || a.cookie(auth.SessionCookie) == nil {
		t.Fatalf("another client behind the proxy: %d", rec.Code)
	}
}

// TestDeviceCookieSignsInThroughAFullThrottle: signing in keeps a device cookie; when a flood has filled the throttle's global bucket, that browser still signs in to
// its account, and a fresh one gets 429.
func TestDeviceCookieSignsInThroughAFullThrottle(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "ana@example.com", access.RoleAdmin)
	known := b.agent(t)
	known.login("ana@example.com")
	var device *http.Cookie
	for _, c := range known.jar.Cookies(siteURL) {
		if c.Name == auth.DeviceCookie || c.Name == auth.HostDeviceCookie { // __Host- when served over https
			device = c
		}
	}
	if device == nil || len(device.Value) != 64 {
		t.Fatalf("no device cookie after signing in: %v", known.jar.Cookies(siteURL))
	}
	known.post("/logout", url.Values{})
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO login_buckets (scope, key, level, updated_at) VALUES ('global', '', 1e9, $1)
		ON CONFLICT (scope, key) DO UPDATE SET level = 1e9, updated_at = $1`, b.clock.Now()); err != nil {
		t.Fatal(err)
	}
	fresh := b.agent(t)
	fresh.get("/login")
	if rec := fresh.post("/login", url.Values{"email": {"ana@example.com"}, "password": {testPassword}}); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a fresh browser during the flood: %d, want 429", rec.Code)
	}
	known.login("ana@example.com")
}
