package handlers_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// HEAD is answered wherever GET is (RFC 9110 §9.3.2): the GET's status and headers, no body.
// Load balancers and monitors probe with HEAD; before, every route answered 405.
func TestHeadIsAnsweredLikeGet(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	s := b.payment(t, "o-head", 1999)
	srv := b.server(t, b.e)
	for _, path := range []string{"/healthz", "/readyz", "/login", "/checkout/o-head", "/static/app.css", "/api/v1/payments/" + s.ID} {
		get, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, get.Body)
		get.Body.Close()
		head, err := http.Head(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(head.Body)
		head.Body.Close()
		if head.StatusCode != get.StatusCode || head.StatusCode == http.StatusMethodNotAllowed || len(body) != 0 ||
			head.Header.Get("Content-Type") != get.Header.Get("Content-Type") {
			t.Errorf("HEAD %s = %d %q (%d body bytes), GET = %d %q", path, head.StatusCode, head.Header.Get("Content-Type"), len(body),
				get.StatusCode, get.Header.Get("Content-Type"))
		}
	}
	// Nor where the GET writes: the outbox marks codes seen, the exports are audited. A HEAD
	// there would do it for a body nobody gets (an outside review).
	for _, path := range []string{"/outbox", "/finance/ledger.csv", "/admin/audit.csv"} {
		resp, err := http.Head(srv.URL + path)
		if err != nil || resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodGet {
			t.Errorf("HEAD %s = %v %v, want 405 with Allow: GET", path, resp, err)
			continue
		}
		// An answer like any other: the security headers ("on every answer", README), a
		// request id. It was written before the middleware chain (an outside review).
		for _, h := range []string{"Content-Security-Policy", "X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy", "X-Request-Id"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("HEAD %s: 405 without %s", path, h)
			}
		}
	}
	// A route with no GET still says which methods it has.
	if resp, err := http.Head(srv.URL + "/logout"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("HEAD /logout = %v %v, want 405", resp, err)
	}
}

// The GETs that write (the outbox marks codes seen by the viewer; the exports are audited) do
// not answer a navigation from another site: the session cookie (SameSite=Lax) goes along, and a
// link sent to an admin marked every code in the outbox as seen by them, who could then not
// confirm it (an outside review). From the console itself they open as before.
func TestGetsThatWriteRefuseCrossSiteNavigation(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "adm@example.com", access.RoleAdmin)
	adm := b.agent(t)
	adm.login("adm@example.com")
	for _, path := range []string{"/outbox", "/finance/ledger.csv", "/admin/audit.csv"} {
		// A page on a sibling subdomain is another site's to the console (same-site).
		for _, site := range []string{"cross-site", "same-site"} {
			if rec := adm.get(path, "Sec-Fetch-Site", site); rec.Code != http.StatusForbidden {
				t.Errorf("%s GET %s = %d, want 403", site, path, rec.Code)
			}
		}
		if rec := adm.get(path, "Sec-Fetch-Site", "same-origin"); rec.Code != http.StatusOK {
			t.Errorf("same-origin GET %s = %d, want 200", path, rec.Code)
		}
	}
	// Nor is a live stream opened by another site's page (an outside review): a sibling
	// subdomain's EventSource with credentials held the user's streams. Its request is ended
	// before it is sent, so a stream that opened returns at once (and is not a 403).
	for _, path := range []string{"/live/dashboard", "/live/finance/cases"} {
		for _, site := range []string{"cross-site", "same-site"} {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			r := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
			r.Header.Set("Sec-Fetch-Site", site)
			if rec := adm.do(r); rec.Code != http.StatusForbidden {
				t.Errorf("%s GET %s = %d, want 403", site, path, rec.Code)
			}
		}
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action IN ($1, $2)`, payments.AuditLedgerExport, payments.AuditAuditExport); n != 2 {
		t.Fatalf("export audit entries = %d, want the two same-origin exports", n)
	}
}

// A client's X-Request-Id goes into every log line and the answer: only a short plain id is
// kept; anything else is replaced by one of ours (an outside review: 64 KiB ids, forged ones).
func TestRequestIDsAreShortAndPlain(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	a := b.agent(t)
	if rec := a.get("/login", "X-Request-Id", "shop-7f3a:retry.2"); rec.Header().Get("X-Request-Id") != "shop-7f3a:retry.2" {
		t.Errorf("a plain id is not kept: %q", rec.Header().Get("X-Request-Id"))
	}
	for _, bad := range []string{strings.Repeat("a", 65), "id with spaces", "id\u00e9"} {
		if got := a.get("/login", "X-Request-Id", bad).Header().Get("X-Request-Id"); got == bad || got == "" {
			t.Errorf("X-Request-Id %q answered with %q, want one of ours", bad, got)
		}
	}
}
