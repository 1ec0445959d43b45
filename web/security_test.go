package web_test

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"pitlane/web"
)

// TestSecurityHeadersOnEveryAnswer: pages, static files, the API, errors and unknown paths all
// carry the policy; HSTS only when the public URL is https.
func TestSecurityHeadersOnEveryAnswer(t *testing.T) {
	t.Parallel()
	for _, hsts := range []bool{false, true} {
		e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), HSTS: hsts, Payments: offline(t)})
		for _, r := range []struct{ method, path string }{
			{"GET", "/healthz"}, {"GET", "/login"}, {"GET", "/static/app.js"}, {"GET", "/api/openapi.json"},
			{"GET", "/api/v1/payments/x"}, {"GET", "/no/such/page"}, {"POST", "/healthz"}, {"GET", "/checkout/o-1"},
		} {
			rec := do(e, r.method, r.path)
			h := rec.Header()
			csp := h.Get("Content-Security-Policy")
			if !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") ||
				strings.Contains(csp, "unsafe-inline") {
				t.Errorf("%s %s (%d): Content-Security-Policy %q", r.method, r.path, rec.Code, csp)
			}
			for k, want := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY"} {
				if got := h.Get(k); got != want {
					t.Errorf("%s %s (%d): %s %q, want %q", r.method, r.path, rec.Code, k, got, want)
				}
			}
			if got := h.Get("Strict-Transport-Security"); (got != "") != hsts || (hsts && !strings.HasPrefix(got, "max-age=")) {
				t.Errorf("%s %s with HSTS %v: Strict-Transport-Security %q", r.method, r.path, hsts, got)
			}
		}
	}
}

// TestRequestLogKeepsNoQueryValues: a checkout link carries the customer's contact in its query;
// the request log names the parameters, never their values.
func TestRequestLogKeepsNoQueryValues(t *testing.T) {
	t.Parallel()
	e, logs := newServer(t, nil)
	do(e, http.MethodGet, "/checkout/o-1?amount=1999&currency=EUR&sig=abc&contact=alice%40example.com")
	do(e, http.MethodGet, "/no/such/page?q=bob@example.com")
	out := logs.String()
	if strings.Contains(out, "alice") || strings.Contains(out, "bob@") || strings.Contains(out, "abc") {
		t.Fatalf("the log carries query values:\n%s", out)
	}
	if !strings.Contains(out, `"uri":"/checkout/o-1?amount=…&contact=…&currency=…&sig=…"`) {
		t.Fatalf("the log does not name the path and the parameters:\n%s", out)
	}
}

// TestClientAddressTrustsOnlyTrustedProxies: X-Forwarded-For names the client only when the peer
// is one of TRUSTED_PROXIES; from anyone else it is ignored (the throttle counts the peer).
func TestClientAddressTrustsOnlyTrustedProxies(t *testing.T) {
	t.Parallel()
	_, lan, _ := net.ParseCIDR("10.0.0.0/8")
	for _, tc := range []struct {
		trusted []*net.IPNet
		peer    string
		xff     string
		want    string
	}{
		{nil, "203.0.113.9:5555", "198.51.100.1", "203.0.113.9"},
		{[]*net.IPNet{lan}, "203.0.113.9:5555", "198.51.100.1", "203.0.113.9"},
		{[]*net.IPNet{lan}, "10.1.2.3:5555", "198.51.100.1", "198.51.100.1"},
		{[]*net.IPNet{lan}, "10.1.2.3:5555", "198.51.100.1, 10.9.9.9", "198.51.100.1"},
		{[]*net.IPNet{lan}, "10.1.2.3:5555", "", "10.1.2.3"},
	} {
		e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), TrustedProxies: tc.trusted, Payments: offline(t)})
		e.GET("/ip", func(c echo.Context) error { return c.String(http.StatusOK, c.RealIP()) })
		r := httptest.NewRequest(http.MethodGet, "/ip", nil)
		r.RemoteAddr = tc.peer
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, r)
		if got := rec.Body.String(); got != tc.want {
			t.Errorf("trusted %v, peer %s, X-Forwarded-For %q: client %q, want %q", tc.trusted, tc.peer, tc.xff, got, tc.want)
		}
	}
}
