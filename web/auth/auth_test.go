package auth_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/web/auth"
)

// A handler that succeeds just as its request's context ends (the request's bound fired
// between its last statement and its answer) still gets its session saved: the save outlives
// the request by auth.SaveGrace. Before, a sign-in answered 303 "signed in" while its session
// was never stored (no cookie), and a renewal had already deleted the old one: signed out.
func TestSessionSaveOutlivesTheRequestsEnd(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	m := auth.New(auth.Config{DB: pool, Access: access.New(pool, payments.NewManualClock(time.Now())), Secret: []byte("0123456789abcdef0123456789abcdef")})
	e := echo.New()
	type cutKey struct{}
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // the request's bound, fired by the handler
		return func(c echo.Context) error {
			ctx, cut := context.WithCancel(c.Request().Context())
			defer cut()
			c.SetRequest(c.Request().WithContext(context.WithValue(ctx, cutKey{}, cut)))
			return next(c)
		}
	}, m.Sessions())
	e.POST("/in", func(c echo.Context) error {
		if err := m.SignIn(c, access.User{ID: 1, Email: "ops@example.com", Role: access.RoleSupport, SessionEpoch: 1}); err != nil {
			return err
		}
		c.Request().Context().Value(cutKey{}).(context.CancelFunc)()
		return c.Redirect(http.StatusSeeOther, "/")
	})
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/in", nil))
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d\n%s", rec.Code, rec.Body)
	}
	var cookie *http.Cookie
	for _, c := range rec.Result().Cookies() {
		if c.Name == auth.SessionCookie && c.Value != "" {
			cookie = c
		}
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM sessions WHERE expiry > now()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if cookie == nil || n != 1 {
		t.Fatalf("answered signed in, but session cookie %v and %d stored sessions", cookie, n)
	}
}
