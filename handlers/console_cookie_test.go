package handlers_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/web"
	"pitlane/web/auth"
)

var httpsSite, _ = url.Parse("https://console.test/")

// setCookie is the Set-Cookie line of rec for the cookie name ("" when none).
func setCookie(rec interface{ Header() http.Header }, name string) string {
	for _, line := range rec.Header().Values("Set-Cookie") {
		if strings.HasPrefix(line, name+"=") {
			return line
		}
	}
	return ""
}

// httpsBench is a console bench with a support user and a second replica served over https
// (SecureCookies), as of this release; the bench's first replica stands for one before it.
func httpsBench(t *testing.T) (*consoleBench, http.Handler) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	b.deps = func(d *web.Deps) { d.SecureCookies = true }
	_, e := b.replica(b.pool, "replica-https", b.gw)
	return b, e
}

// Over https the console's cookies carry the __Host- prefix: a browser takes them only from this
// exact host (Secure, Path=/, no Domain), so a page on a sibling or parent domain cannot plant a
// session or a CSRF seed. During the rollout the unprefixed cookie is written beside each with the
// same value (replicas before this release read only that one), and a sign-out moves both.
// Before, both cookies were unprefixed.
func TestConsoleCookiesOverHTTPSAreHostPrefixed(t *testing.T) {
	t.Parallel()
	_, eNew := httpsBench(t)
	a := newAgentAt(t, eNew, httpsSite)

	csrf := setCookie(a.get("/login"), auth.HostCSRFCookie)
	for _, want := range []string{"Path=/", "Secure", "HttpOnly"} {
		if !strings.Contains(csrf, want) || strings.Contains(csrf, "Domain=") {
			t.Fatalf("CSRF cookie %q: want %s and no Domain", csrf, want)
		}
	}
	rec := a.post("/login", url.Values{"email": {"sup@example.com"}, "password": {testPassword}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", rec.Code, rec.Body)
	}
	session := setCookie(rec, auth.HostSessionCookie)
	for _, want := range []string{"Path=/", "Secure", "HttpOnly", "SameSite=Lax"} {
		if !strings.Contains(session, want) || strings.Contains(session, "Domain=") {
			t.Fatalf("session cookie %q: want %s and no Domain", session, want)
		}
	}
	prefixed, plain := a.cookie(auth.HostSessionCookie), a.cookie(auth.SessionCookie)
	if prefixed == nil || plain == nil || prefixed.Value != plain.Value {
		t.Fatalf("rollout: the unprefixed session cookie must carry the same token: %v %v", prefixed, plain)
	}
	if got := a.get("/"); got.Code != http.StatusOK {
		t.Fatalf("dashboard: %d", got.Code)
	}
	a.post("/logout", nil)
	if p, u := a.cookie(auth.HostSessionCookie), a.cookie(auth.SessionCookie); p == nil || u == nil || p.Value != u.Value || p.Value == prefixed.Value {
		t.Fatalf("sign-out must move both cookies to the same new token: %v %v", p, u)
	}
	if a.get("/").Code != http.StatusSeeOther {
		t.Fatal("signed in after sign-out")
	}
	// A token left in only one of the two cookies does not sign anyone in again.
	a.jar.SetCookies(httpsSite, []*http.Cookie{{Name: auth.SessionCookie, Value: prefixed.Value}})
	if a.get("/").Code != http.StatusSeeOther {
		t.Fatal("the signed-out token in the unprefixed cookie signed the browser in")
	}
}

// A rolling deploy signs nobody out: a browser signed in by a replica before this release (only
// the unprefixed cookie) is signed in on a new one, which gives it the prefixed cookie with the
// same token; a sign-in form rendered by an old replica posts fine to a new one. Without the
// fallback the new replica saw nobody and refused the form.
func TestConsoleHostPrefixRolloutKeepsOldCookies(t *testing.T) {
	t.Parallel()
	b, eNew := httpsBench(t)

	old := b.agent(t) // on the bench's first replica: one before this release
	old.login("sup@example.com")
	a := newAgentAt(t, eNew, httpsSite)
	a.jar.SetCookies(httpsSite, []*http.Cookie{{Name: auth.SessionCookie, Value: old.cookie(auth.SessionCookie).Value}})
	rec := a.get("/")
	if rec.Code != http.StatusOK {
		t.Fatalf("a session from an old replica on a new one: %d (want the dashboard)", rec.Code)
	}
	if c := a.cookie(auth.HostSessionCookie); c == nil || c.Value != old.cookie(auth.SessionCookie).Value {
		t.Fatalf("the new replica must give the browser the prefixed cookie with the same token: %v", c)
	}

	visitor := newAgent(t, b.e)
	visitor.get("/login") // rendered by the old replica: its token is bound to the unprefixed seed
	seed := visitor.cookie(auth.CSRFCookie)
	moved := newAgentAt(t, eNew, httpsSite)
	moved.jar.SetCookies(httpsSite, []*http.Cookie{seed})
	moved.csrf = visitor.csrf
	if rec := moved.post("/login", url.Values{"email": {"sup@example.com"}, "password": {testPassword}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("an old replica's sign-in form on a new one: %d %s", rec.Code, rec.Body)
	}
}

// The unprefixed CSRF seed of the rollout counts only for a visitor without the __Host- one: a
// page on a sibling subdomain can plant an unprefixed cookie (Domain=) beside the victim's
// __Host- seed, with a value the attacker chose and whose token the attacker learned from its
// own visit. That signed the victim in to the attacker's account (an outside review).
func TestPlantedLegacyCSRFSeedBesideTheHostOneIsRefused(t *testing.T) {
	t.Parallel()
	_, eNew := httpsBench(t)
	seed := "attacker-chosen-seed-attacker-chosen-seed-0123456789"
	attacker := newAgentAt(t, eNew, httpsSite)
	attacker.jar.SetCookies(httpsSite, []*http.Cookie{{Name: auth.CSRFCookie, Value: seed}})
	attacker.get("/login")
	tok := attacker.csrf

	victim := newAgentAt(t, eNew, httpsSite)
	victim.get("/login")
	if victim.cookie(auth.HostCSRFCookie) == nil {
		t.Fatal("the victim has no __Host- CSRF cookie")
	}
	victim.jar.SetCookies(httpsSite, []*http.Cookie{{Name: auth.CSRFCookie, Value: seed}}) // planted by a sibling
	form := url.Values{"email": {"sup@example.com"}, "password": {testPassword}, "csrf_token": {tok}}
	r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Sec-Fetch-Site", "same-site")
	if rec := victim.do(r); rec.Code != http.StatusForbidden {
		t.Fatalf("a sign-in with the planted seed's token: %d, want 403", rec.Code)
	}
	// A visitor with only the unprefixed seed (signed in on a replica before this release)
	// still posts with its token.
	old := newAgentAt(t, eNew, httpsSite)
	old.jar.SetCookies(httpsSite, []*http.Cookie{{Name: auth.CSRFCookie, Value: seed}})
	form.Set("csrf_token", tok)
	r = httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if rec := old.do(r); rec.Code != http.StatusSeeOther {
		t.Fatalf("a visitor with only the unprefixed seed: %d, want the sign-in", rec.Code)
	}
}

// The unprefixed session cookie of the rollout brings in only a session signed in by a replica
// before this release: a page on a sibling subdomain can plant that cookie (Domain=) with the
// token of the attacker's own session in a browser without a __Host- session (a fresh one, or
// one that only opened the sign-in page), and the replica took it, signed the victim in as the
// attacker and even wrote the planted token into the __Host- cookie (an outside review).
func TestPlantedLegacySessionCookieDoesNotSignTheVictimIn(t *testing.T) {
	t.Parallel()
	b, eNew := httpsBench(t)
	b.user(t, "attacker@example.com", access.RoleSupport)

	attacker := newAgentAt(t, eNew, httpsSite)
	attacker.login("attacker@example.com")
	token := attacker.cookie(auth.HostSessionCookie).Value

	victim := newAgentAt(t, eNew, httpsSite)
	victim.get("/login")
	victim.jar.SetCookies(httpsSite, []*http.Cookie{{Name: auth.SessionCookie, Value: token}}) // planted by a sibling
	if rec := victim.get("/account"); rec.Code != http.StatusSeeOther {
		t.Fatalf("a planted unprefixed session cookie: %d (want the sign-in page)\n%s", rec.Code, rec.Body)
	}
	if c := victim.cookie(auth.HostSessionCookie); c != nil && c.Value == token {
		t.Fatal("the planted token was written into the victim's __Host- cookie")
	}
	// The attacker's own browser is unaffected.
	if rec := attacker.get("/account"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "attacker@example.com") {
		t.Fatalf("the attacker's own session: %d", rec.Code)
	}
}

// A browser with no __Host- CSRF seed yet (a fresh or restarted one: the cookie dies with the
// browser) takes the unprefixed seed of the rollout, and a page on a sibling subdomain can plant
// one (Domain=) with the value the attacker got by opening /login, then post the sign-in form
// with the attacker's credentials and that seed's token: the victim's browser signed in as the
// attacker (login CSRF; an outside review). The browser says where the form came from
// (Sec-Fetch-Site: same-site), and a sibling is another site to the console. Negative control:
// refusing only cross-site posts signs the victim in.
func TestPlantedLegacyCSRFSeedInAFreshBrowserIsRefused(t *testing.T) {
	t.Parallel()
	b, eNew := httpsBench(t)
	b.user(t, "attacker@example.com", access.RoleSupport)
	attacker := newAgentAt(t, eNew, httpsSite)
	attacker.get("/login")
	seed := attacker.cookie(auth.CSRFCookie) // the unprefixed twin written beside the __Host- one
	if seed == nil {
		t.Fatal("no unprefixed seed written")
	}

	victim := newAgentAt(t, eNew, httpsSite)                                                     // has not opened the console in this browser session
	victim.jar.SetCookies(httpsSite, []*http.Cookie{{Name: auth.CSRFCookie, Value: seed.Value}}) // planted by the sibling
	form := url.Values{"email": {"attacker@example.com"}, "password": {testPassword}, "csrf_token": {attacker.csrf}}
	r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Sec-Fetch-Site", "same-site")
	if rec := victim.do(r); rec.Code != http.StatusForbidden {
		t.Fatalf("a sign-in posted from a sibling site with a planted seed: %d, want 403", rec.Code)
	}
	if victim.cookie(auth.HostSessionCookie) != nil {
		t.Fatal("the victim's browser got a session")
	}
}
