package handlers_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/handlers"
	"pitlane/payments"
	"pitlane/web"
)

// The console's idle timeout: a staff session ends after CONSOLE_IDLE_TIMEOUT without a request
// of the user's own. A live page refreshing itself (its region's refreshes, its stream) is not
// one, so a console left open on a desk signs out. The sessions' clock is their own (the wall
// clock in production); these tests move it.

// idleRouter is the bench's router with a session clock of its own and a 30-minute timeout
// (or the one given).
func idleRouter(b *consoleBench, idle ...time.Duration) (*echo.Echo, *payments.ManualClock) {
	timeout := 30 * time.Minute
	if len(idle) > 0 {
		timeout = idle[0]
	}
	clock := payments.NewManualClock(consoleT0)
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: b.pool, ReplicaID: "replica-a", Payments: b.svc,
		Access: access.New(b.pool, b.clock), SecretKey: []byte("console-test-secret-console-test-secret"),
		MerchantName: testMerchant, Live: b.hub, ConsoleIdleTimeout: timeout, SessionClock: clock.Now})
	return e, clock
}

// At the shortest timeout CONSOLE_IDLE_TIMEOUT allows (1m), a user active every 30 s stays
// signed in. The idle stamp was written at most once a minute, in whole seconds: a request
// 0.6 s after the one before found the session a minute past its stamp and signed the user out
// (an outside review). It is written at most a 30th of the timeout apart now.
func TestConsoleOneMinuteIdleTimeoutKeepsAnActiveUser(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", "support")
	e, clock := idleRouter(b, time.Minute)
	a := newAgent(t, e)
	clock.Advance(900 * time.Millisecond)
	a.login("sup@example.com") // stamped at the whole second below 00:00.9
	for _, step := range []time.Duration{30 * time.Second, 29 * time.Second, 600 * time.Millisecond} {
		clock.Advance(step)
		if rec := a.get("/payments"); rec.Code != http.StatusOK {
			t.Fatalf("a request %s after the one before (at %s): %d to %q, want the user still signed in",
				step, clock.Now().Format("04:05.000"), rec.Code, rec.Header().Get("Location"))
		}
	}
	clock.Advance(61 * time.Second) // then a minute without a request: signed out
	if rec := a.get("/payments"); rec.Code != http.StatusSeeOther {
		t.Fatalf("after a minute idle: %d, want 303 to the sign-in page", rec.Code)
	}
}

// TestConsoleSignsOutAfterIdleTimeout: the user's own requests keep the session; live refreshes
// do not; past the timeout the next request (a live refresh here) ends the session and sends the
// browser to the sign-in page, which says why; signing in again works.
func TestConsoleSignsOutAfterIdleTimeout(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	e, clock := idleRouter(b)
	a := newAgent(t, e)
	a.login("sup@example.com")
	live := func() *http.Response {
		t.Helper()
		return a.get("/", "HX-Request", "true", handlers.LiveHeader, "1").Result()
	}

	clock.Advance(29 * time.Minute)
	if rec := a.get("/payments"); rec.Code != http.StatusOK {
		t.Fatalf("29 minutes after sign-in: %d", rec.Code)
	}
	clock.Advance(29 * time.Minute) // 58 minutes after sign-in, 29 after the last request
	if rec := a.get("/"); rec.Code != http.StatusOK {
		t.Fatalf("29 minutes after the user's last request: %d (their requests must keep the session)", rec.Code)
	}
	clock.Advance(20 * time.Minute)
	if r := live(); r.StatusCode != http.StatusOK {
		t.Fatalf("a live refresh 20 minutes after the user's last request: %d", r.StatusCode)
	}
	clock.Advance(11 * time.Minute) // 31 minutes after the user's last request, 11 after the refresh
	r := live()
	if r.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(r.Header.Get("HX-Redirect"), "/login") {
		t.Fatalf("a live refresh 31 minutes after the user's last request: %d HX-Redirect %q; want 401 to the sign-in page (a live refresh must not keep the session)",
			r.StatusCode, r.Header.Get("HX-Redirect"))
	}
	rec := a.get("/payments")
	if rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "/login") {
		t.Fatalf("after the timeout: %d %q, want the sign-in page", rec.Code, rec.Header().Get("Location"))
	}
	wantText(t, page(t, a.follow(rec), http.StatusOK), "flash-error", "signed out after 30 minutes without activity")
	a.login("sup@example.com")
	if rec := a.get("/payments"); rec.Code != http.StatusOK {
		t.Fatalf("after signing in again: %d", rec.Code)
	}
}

// TestConsoleIdleTimeoutEndsAnOpenStream: a live stream does not keep its session either; once
// the user has been idle for the timeout the stream tells nothing more and ends, and a new
// stream is refused (the browser then polls, and the poll sends it to sign in).
func TestConsoleIdleTimeoutEndsAnOpenStream(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	e, clock := idleRouter(b)
	srv := b.server(t, e)
	a := newAgent(t, e)
	a.login("fin@example.com")

	clock.Advance(20 * time.Minute) // a stream opened now does not count as the user's request
	es, resp := openStream(t, srv, a, "/live/dashboard?since="+b.hub.Position().String(), "Accept", "text/event-stream")
	if es == nil {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	es.want("retry: ")
	b.payment(t, "o-idle-1", 1999)
	es.want("id: ")
	clock.Advance(11 * time.Minute) // 31 minutes after sign-in, the user's last request
	if es2, resp := openStream(t, srv, a, "/live/dashboard?since="+b.hub.Position().String(), "Accept", "text/event-stream"); es2 != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a new stream 31 minutes after the user's last request: %v %d, want 401 (a stream must not keep the session)", es2 != nil, resp.StatusCode)
	}
	b.payment(t, "o-idle-2", 1999)
	if line, err := es.r.ReadString('\n'); err == nil {
		t.Fatalf("the open stream went on after the timeout: %q", line)
	}
	if rec := a.get("/"); rec.Code != http.StatusSeeOther {
		t.Fatalf("dashboard after the timeout: %d", rec.Code)
	}
}

// TestBrowserConsoleLeftOpenEndsOnSignIn: Chromium with the dashboard open and nobody at the
// desk. Past the timeout the next change ends the page's stream; the browser's reconnect is
// refused, the page's fallback poll is sent to sign in, and the window shows the sign-in page
// with the reason instead of payments.
func TestBrowserConsoleLeftOpenEndsOnSignIn(t *testing.T) {
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	e, clock := idleRouter(b)
	srv := b.server(t, e)
	ctx := newBrowser(t)
	browserLogin(t, ctx, srv.URL, "fin@example.com")

	openLive(t, ctx, srv.URL+"/")
	clock.Advance(31 * time.Minute)
	b.payment(t, "o-idle-browser", 1999)
	within(t, ctx, 30*time.Second, chromedp.WaitVisible(`[data-testid="login-form"]`))
	waitJS(t, ctx, "the reason on the sign-in page", `(document.querySelector('[data-testid="flash-error"]') || {}).textContent?.includes("without activity") === true`)
}

// TestConsoleFormSentAfterIdleTimeoutLeadsBackToIt: finance types a proposal (the reason and the
// evidence take a while to gather; longer still with a screen reader or a switch) and sends it
// 31 minutes after their last request. It is not carried out; the sign-in page said only "Sign
// in again" and signing in led to the dashboard: the proposal was lost and nothing said it was
// never made (WCAG 2.2.1, 2.2.5; an outside review). Now the message says what was sent was not
// carried out, and signing in leads back to the page the form was sent from: its Referer, when
// it is this site's (through auth.LocalPath). A Referer of another site, one that names no
// site, or none at all leads nowhere but the dashboard: never an open redirect.
//
// Negative control: toSignIn giving a non-GET no next (as before) fails "same origin"; taking
// the Referer's path without comparing its host fails "another site".
func TestConsoleFormSentAfterIdleTimeoutLeadsBackToIt(t *testing.T) {
	t.Parallel()
	b, _, flagged, _ := stuckBench(t)
	e, clock := idleRouter(b)
	form := "/finance/resolutions/new?session=" + flagged.ID
	for _, tc := range []struct {
		name, referer, fetchSite, lands string
	}{
		{"same origin", "http://console.test" + form, "same-origin", form},
		{"same origin, no Sec-Fetch-Site", "http://console.test" + form, "", form},
		{"another site", "https://evil.example" + form, "", "/"},
		{"a path that leaves the site", "http://console.test//evil.example/x", "", "/"},
		{"no Referer", "", "", "/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAgent(t, e)
			a.login("fin@example.com")
			page(t, a.get(form), http.StatusOK)
			clock.Advance(31 * time.Minute)
			sent := url.Values{"session": {flagged.ID}, "outcome": {"Completed"}, "csrf_token": {a.csrf},
				"reason": {"the gateway captured it on the 3rd"}, "evidence": {"bank statement line 42, ticket FIN-77"}}
			r := httptest.NewRequest(http.MethodPost, "/finance/resolutions", strings.NewReader(sent.Encode()))
			r.Host = siteURL.Host
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tc.referer != "" {
				r.Header.Set("Referer", tc.referer)
			}
			if tc.fetchSite != "" {
				r.Header.Set("Sec-Fetch-Site", tc.fetchSite)
			}
			rec := a.do(r)
			if rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "/login") {
				t.Fatalf("the proposal after the timeout: %d %q, want the sign-in page", rec.Code, rec.Header().Get("Location"))
			}
			signIn := page(t, a.follow(rec), http.StatusOK)
			wantText(t, signIn, "flash-error", "what you sent was not carried out")
			next, _ := signIn.Find(`input[name="next"]`).Attr("value")
			rec = a.post("/login", url.Values{"email": {"fin@example.com"}, "password": {testPassword}, "next": {next}})
			if got := rec.Header().Get("Location"); rec.Code != http.StatusSeeOther || got != tc.lands {
				t.Fatalf("signing in again (next %q): %d to %q, want %q", next, rec.Code, got, tc.lands)
			}
			clock.Advance(time.Minute) // the subtests share the clock: each signs in anew
		})
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE session_id = $1`, flagged.ID); n != 0 {
		t.Fatalf("a proposal was made after the timeout (%d)", n)
	}
}
