package auth_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/web/auth"
)

// newManager is a session manager on a fresh database of its own.
func newManager(t *testing.T) (*auth.Manager, *pgxpool.Pool) {
	t.Helper()
	pool := testdb.New(t)
	return auth.New(auth.Config{DB: pool, Access: access.New(pool, payments.NewManualClock(time.Now())),
		Secret: []byte("0123456789abcdef0123456789abcdef")}), pool
}

// sessionCookie is the session cookie an answer set (nil: none, or one that clears it).
func sessionCookie(rec *httptest.ResponseRecorder) *http.Cookie {
	for _, ck := range rec.Result().Cookies() {
		if ck.Name == auth.SessionCookie && ck.Value != "" {
			return ck
		}
	}
	return nil
}

// A handler that succeeds just as its request's context ends (the request's bound fired
// between its last statement and its answer) still gets its session saved: the save outlives
// the request by auth.SaveGrace. Before, a sign-in answered 303 "signed in" while its session
// was never stored (no cookie), and a renewal had already deleted the old one: signed out.
func TestSessionSaveOutlivesTheRequestsEnd(t *testing.T) {
	t.Parallel()
	m, pool := newManager(t)
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
	cookie := sessionCookie(rec)
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM sessions WHERE expiry > now()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if cookie == nil || n != 1 {
		t.Fatalf("answered signed in, but session cookie %v and %d stored sessions", cookie, n)
	}
}

// A sign-out in one tab and a renewal of the same session in another (a new password, "sign out
// everywhere else"), the sign-out having loaded the session just before the renewal deleted
// its token: the sign-out found nothing to delete, and the renewal stored the new token, so the
// browser was signed in again by whichever answer it took last (carried as U2 since the
// thirty-seventh session). The renewal's link (session_renewals) ends with the sign-out: a
// renewal stored after it stores nothing (no cookie), one stored before it is deleted. Negative
// control: DeleteCtx without endRenewals, and CommitCtx without the link — both renewed
// cookies sign the browser in after it signed out.
func TestASignOutEndsTheRenewalItRaced(t *testing.T) {
	t.Parallel()
	for _, storedFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("renewal stored first=%v", storedFirst), func(t *testing.T) {
			t.Parallel()
			m, pool := newManager(t)
			user := access.User{ID: 1, Email: "ops@example.com", Role: access.RoleSupport, SessionEpoch: 1}
			e := echo.New()
			e.Use(m.Sessions())
			outLoaded, outGo := make(chan struct{}), make(chan struct{})
			renewed, renewGo := make(chan struct{}), make(chan struct{})
			e.POST("/in", func(c echo.Context) error {
				if err := m.SignIn(c, user); err != nil {
					return err
				}
				return c.NoContent(http.StatusNoContent) // the session is saved as the answer is written
			})
			e.POST("/out", func(c echo.Context) error {
				close(outLoaded) // the session is loaded: the sign-out will go through
				<-outGo
				if err := m.SignOut(c); err != nil {
					return err
				}
				return c.NoContent(http.StatusNoContent)
			})
			e.POST("/renew", func(c echo.Context) error {
				if err := m.SignInAgain(c, user); err != nil {
					return err
				}
				close(renewed) // the old token is deleted; the new one is stored at the answer
				<-renewGo
				return c.NoContent(http.StatusNoContent)
			})
			e.GET("/who", func(c echo.Context) error { return c.String(http.StatusOK, m.SignedIn(c)) })
			serve := func(method, path string, ck *http.Cookie) *httptest.ResponseRecorder {
				r := httptest.NewRequest(method, path, nil)
				if ck != nil {
					r.AddCookie(ck)
				}
				rec := httptest.NewRecorder()
				e.ServeHTTP(rec, r)
				return rec
			}
			first := sessionCookie(serve(http.MethodPost, "/in", nil))
			if first == nil {
				t.Fatal("sign-in set no session cookie")
			}
			out := make(chan *httptest.ResponseRecorder, 1)
			go func() { out <- serve(http.MethodPost, "/out", first) }()
			<-outLoaded
			renewal := make(chan *httptest.ResponseRecorder, 1)
			go func() { renewal <- serve(http.MethodPost, "/renew", first) }()
			<-renewed
			var late *httptest.ResponseRecorder
			if storedFirst {
				close(renewGo)
				late = <-renewal
				if sessionCookie(late) == nil {
					t.Fatal("the renewal, stored before the sign-out, set no cookie")
				}
				close(outGo)
				<-out
			} else {
				close(outGo)
				<-out
				close(renewGo)
				late = <-renewal
			}
			if ck := sessionCookie(late); ck != nil {
				if who := serve(http.MethodGet, "/who", ck).Body.String(); who != "" {
					t.Fatalf("signed out, but the renewal's cookie still signs the browser in as %q", who)
				}
			}
			var live int
			if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM sessions WHERE expiry > now()`).Scan(&live); err != nil {
				t.Fatal(err)
			}
			if live > 1 { // the sign-out's own (a message for the sign-in page, no one signed in)
				t.Fatalf("%d sessions stored after the sign-out, want at most its own", live)
			}
		})
	}
}

// ReapSessions deletes expired renewal links with the expired sessions (a sign-in reaps on its
// way and only logs a failure, so a broken statement would go unnoticed there).
func TestReapSessionsReapsExpiredRenewalLinks(t *testing.T) {
	t.Parallel()
	m, pool := newManager(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `INSERT INTO sessions (token, data, expiry) VALUES ('old', '', now() - interval '1 minute'), ('new', '', now() + interval '1 hour');
		INSERT INTO session_renewals (old_token, expiry) VALUES ('a', now() - interval '1 minute'), ('b', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	n, err := m.ReapSessions(ctx)
	if err != nil || n != 1 {
		t.Fatalf("reaped %d sessions (%v), want 1", n, err)
	}
	var sessions, links string
	if err := pool.QueryRow(ctx, `SELECT (SELECT string_agg(token, ',') FROM sessions), (SELECT string_agg(old_token, ',') FROM session_renewals)`).Scan(&sessions, &links); err != nil {
		t.Fatal(err)
	}
	if sessions != "new" || links != "b" {
		t.Fatalf("left sessions %q and links %q, want the live ones alone (new, b)", sessions, links)
	}
}
