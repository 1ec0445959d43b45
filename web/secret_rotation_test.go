package web_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"regexp"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"pitlane/internal/testdb"
	"pitlane/web"
	"pitlane/web/auth"
)

var csrfFieldRe = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// TestCSRFTokenSurvivesSecretKeyRotation: the sign-in form (a visitor without a session: its
// CSRF token is an HMAC of its cookie under SECRET_KEY) rendered by a replica on one side of a
// SECRET_KEY rotation posts fine to a replica on the other side that has that secret in
// SECRET_KEY_FALLBACKS, both ways; a replica without it refuses the form (the negative control:
// what a rotation did to every open form before the fallbacks).
func TestCSRFTokenSurvivesSecretKeyRotation(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	oldKey, newKey := []byte(strings.Repeat("o", 32)), []byte(strings.Repeat("n", 32))
	server := func(current []byte, fallbacks ...[]byte) *echo.Echo {
		return web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, SecretKey: current, SecretKeyFallbacks: fallbacks,
			Payments: payments.NewService(pool, payments.Config{Gateway: fakegw.New()})})
	}
	before, step1, step2, afterward := server(oldKey), server(oldKey, newKey), server(newKey, oldKey), server(newKey)

	// form renders the sign-in page on e: the visitor's CSRF cookie and the form's token.
	form := func(e *echo.Echo) (*http.Cookie, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/login", nil))
		var ck *http.Cookie
		for _, c := range rec.Result().Cookies() {
			if c.Name == auth.CSRFCookie {
				ck = c
			}
		}
		m := csrfFieldRe.FindStringSubmatch(rec.Body.String())
		if rec.Code != http.StatusOK || ck == nil || m == nil {
			t.Fatalf("GET /login = %d, cookie %v, no token in the form:\n%s", rec.Code, ck, rec.Body)
		}
		return ck, m[1]
	}
	// post sends the form to e: a wrong password is 422 past the CSRF check, a refused token 403.
	post := func(e *echo.Echo, ck *http.Cookie, token string) int {
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{
			"email": {"nobody@example.com"}, "password": {"not the password"}, "csrf_token": {token}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(ck)
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, tc := range []struct {
		name         string
		render, send *echo.Echo
		want         int
	}{
		{"before → step 2 (old secret as fallback)", before, step2, http.StatusUnprocessableEntity},
		{"step 2 → step 1 (new secret as fallback)", step2, step1, http.StatusUnprocessableEntity},
		{"step 1 → step 2", step1, step2, http.StatusUnprocessableEntity},
		{"same replica", afterward, afterward, http.StatusUnprocessableEntity},
		{"before → after, no fallback", before, afterward, http.StatusForbidden},
		{"step 2 → before, no fallback", step2, before, http.StatusForbidden},
	} {
		ck, token := form(tc.render)
		if got := post(tc.send, ck, token); got != tc.want {
			t.Errorf("%s: POST /login = %d, want %d", tc.name, got, tc.want)
		}
	}
}
