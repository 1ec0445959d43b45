package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/a-h/templ"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/labstack/echo/v4"
	"go.uber.org/goleak"

	"pitlane/internal/testdb"
	"pitlane/internal/testlog"
	"pitlane/migrations"
	"pitlane/payments"
	"pitlane/web"
	"pitlane/web/render"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newServer is a server on pool (nil: a database that never answers).
func newServer(t *testing.T, pool *pgxpool.Pool) (*echo.Echo, *testlog.Buffer) {
	t.Helper()
	if pool == nil {
		pool = testdb.Unreachable(t)
	}
	logs := &testlog.Buffer{}
	e := web.New(web.Deps{Logger: slog.New(slog.NewJSONHandler(logs, nil)), ReplicaID: "replica-test",
		Payments: payments.NewService(pool, payments.Config{})})
	return e, logs
}

// offline is a payment service whose database never answers, for what a server does before
// and without its database (headers, spans, the client's address).
func offline(t *testing.T) *payments.Service {
	return payments.NewService(testdb.Unreachable(t), payments.Config{})
}

func do(e *echo.Echo, method, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

func TestReadyzBeforeAndAfterMigrations(t *testing.T) {
	t.Parallel()
	url := testdb.NewEmptyURL(t)
	pool := testdb.Pool(t, url)
	e, _ := newServer(t, pool)

	if rec := do(e, http.MethodGet, "/healthz"); rec.Code != http.StatusOK {
		t.Fatalf("/healthz = %d", rec.Code)
	}
	rec := do(e, http.MethodGet, "/readyz")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "migrations pending") {
		t.Fatalf("/readyz on an empty database = %d %s, want 503 migrations pending", rec.Code, rec.Body)
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := migrations.Up(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	rec = do(e, http.MethodGet, "/readyz")
	if rec.Code != http.StatusOK {
		t.Fatalf("/readyz after migrations = %d %s, want 200", rec.Code, rec.Body)
	}
}

// A replica that has not read the database's clock yet (payments.DatabaseClock: it started
// before its database answered) is not ready: its times would be its host's.
func TestReadyzWaitsForTheDatabasesClock(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t, testdb.NewURL(t))
	clock := payments.NewDatabaseClock(nil)
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), ReplicaID: "replica-test",
		Payments: payments.NewService(pool, payments.Config{Clock: clock}), ClockSynced: clock.Synced()})
	rec := do(e, http.MethodGet, "/readyz")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "clock") {
		t.Fatalf("/readyz before the clock was read = %d %s, want 503", rec.Code, rec.Body)
	}
	if _, _, err := clock.Sync(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	if rec := do(e, http.MethodGet, "/readyz"); rec.Code != http.StatusOK {
		t.Fatalf("/readyz after the clock was read = %d %s, want 200", rec.Code, rec.Body)
	}
}

func TestReadyzDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: the listener is closed before the pool tries it.
	l := httptest.NewServer(http.NotFoundHandler())
	addr := l.Listener.Addr().String()
	l.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@"+addr+"/x?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e, _ := newServer(t, pool)
	rec := do(e, http.MethodGet, "/readyz")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "database unreachable") {
		t.Fatalf("/readyz = %d %s, want 503 database unreachable", rec.Code, rec.Body)
	}
	if rec := do(e, http.MethodGet, "/healthz"); rec.Code != http.StatusOK {
		t.Fatalf("/healthz must not depend on the database: %d", rec.Code)
	}
}

// TestConsoleShell: the sign-in page renders the console's layout (stylesheet and scripts
// with hashed, immutable URLs; the replica id), and needs no database to do so. (Signed-in
// pages are tested in handlers/console_*_test.go.)
func TestConsoleShell(t *testing.T) {
	t.Parallel()
	e, _ := newServer(t, nil)
	rec := do(e, http.MethodGet, "/login")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET /login = %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	doc, err := goquery.NewDocumentFromReader(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Find(`[data-testid="login-form"]`).Length() != 1 || doc.Find(`[data-testid="nav"]`).Length() != 0 {
		t.Errorf("sign-in page: form %d, nav %d", doc.Find(`[data-testid="login-form"]`).Length(), doc.Find(`[data-testid="nav"]`).Length())
	}
	if got := doc.Find(`[data-testid="replica"]`).Text(); got != "replica-test" {
		t.Errorf("replica = %q", got)
	}
	css, ok := doc.Find(`link[rel="stylesheet"]`).Attr("href")
	if !ok || !strings.HasPrefix(css, "/static/app.css?v=") {
		t.Fatalf("stylesheet href %q", css)
	}
	for _, src := range append([]string{css}, doc.Find(`script[src]`).Map(func(_ int, s *goquery.Selection) string { return s.AttrOr("src", "") })...) {
		rec = do(e, http.MethodGet, src)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("Cache-Control"), "immutable") {
			t.Fatalf("GET %s = %d %v", src, rec.Code, rec.Header())
		}
	}
	if n := doc.Find(`script[src^="/static/htmx.min.js?v="]`).Length(); n != 1 {
		t.Errorf("htmx script tags: %d", n)
	}
}

func TestErrorHandlerMapsDomainCodes(t *testing.T) {
	t.Parallel()
	e, logs := newServer(t, nil)
	cases := []struct {
		code       string
		status     int
		retryAfter bool
	}{
		{payments.EINVALID, 422, false},
		{payments.ENOTFOUND, 404, false},
		{payments.ECONFLICT, 409, false},
		{payments.EEXPIRED, 410, false},
		{payments.ELOCKED, 429, false},
		{payments.EWRONG, 422, false},
		{payments.EBUSY, 409, true},
		{payments.EUNAVAIL, 503, true},
		{payments.EINTERNAL, 500, false},
		{payments.EUNAUTHENTICATED, 401, false},
		{payments.EFORBIDDEN, 403, false},
	}
	for _, tc := range cases {
		err := fmt.Errorf("handler: %w", &payments.Error{Code: tc.code, Message: "message for " + tc.code, Field: "amount"})
		e.GET("/api/v1/err/"+tc.code, func(echo.Context) error { return err })
		e.GET("/page/"+tc.code, func(echo.Context) error { return err })
	}
	for _, tc := range cases {
		rec := do(e, http.MethodGet, "/api/v1/err/"+tc.code)
		if rec.Code != tc.status {
			t.Errorf("%s: status %d, want %d", tc.code, rec.Code, tc.status)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s: content type %q", tc.code, ct)
		}
		var p map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("%s: body %q: %v", tc.code, rec.Body, err)
		}
		for _, k := range []string{"type", "title", "status", "detail"} {
			if _, ok := p[k]; !ok {
				t.Errorf("%s: problem lacks %q: %v", tc.code, k, p)
			}
		}
		if p["status"] != float64(tc.status) {
			t.Errorf("%s: problem status %v", tc.code, p["status"])
		}
		wantDetail := "message for " + tc.code
		if tc.code == payments.EINTERNAL {
			wantDetail = "internal error"
		}
		if p["detail"] != wantDetail {
			t.Errorf("%s: detail %v, want %q", tc.code, p["detail"], wantDetail)
		}
		if got := rec.Header().Get("Retry-After") != ""; got != tc.retryAfter {
			t.Errorf("%s: Retry-After present = %v", tc.code, got)
		}

		rec = do(e, http.MethodGet, "/page/"+tc.code)
		if rec.Code != tc.status || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
			t.Errorf("%s page: %d %s", tc.code, rec.Code, rec.Header().Get("Content-Type"))
			continue
		}
		doc, _ := goquery.NewDocumentFromReader(rec.Body)
		if got := doc.Find(`[data-testid="error-status"]`).Text(); got != fmt.Sprint(tc.status) {
			t.Errorf("%s page: error-status %q", tc.code, got)
		}
	}
	// Only internal errors are logged, with their real cause.
	out := logs.String()
	if !strings.Contains(out, `"msg":"internal error"`) || !strings.Contains(out, "message for internal") {
		t.Errorf("internal error not logged: %s", out)
	}
	if strings.Count(out, `"msg":"internal error"`) != 2 { // the API call and the page
		t.Errorf("want exactly the two internal errors logged, got: %s", out)
	}
}

func TestPlainErrorsAndUnknownRoutes(t *testing.T) {
	t.Parallel()
	e, logs := newServer(t, nil)
	e.GET("/api/v1/plain", func(echo.Context) error { return errors.New("pq: secret SQL detail") })
	rec := do(e, http.MethodGet, "/api/v1/plain")
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "secret SQL") {
		t.Fatalf("plain error: %d %s (internal details must not leak)", rec.Code, rec.Body)
	}
	if !strings.Contains(logs.String(), "secret SQL detail") {
		t.Errorf("plain error not logged")
	}
	rec = do(e, http.MethodGet, "/api/v1/nothing-here")
	if rec.Code != 404 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("unknown API route: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	rec = do(e, http.MethodGet, "/nothing-here")
	if rec.Code != 404 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Errorf("unknown page: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	rec = do(e, http.MethodPost, "/healthz")
	if rec.Code != http.StatusMethodNotAllowed || !slices.Contains(strings.Split(rec.Header().Get("Allow"), ", "), http.MethodHead) {
		t.Errorf("POST /healthz = %d, Allow: %q (HEAD is served where GET is)", rec.Code, rec.Header().Get("Allow"))
	}
	rec = do(e, http.MethodPost, "/outbox")
	if rec.Code != http.StatusMethodNotAllowed || strings.Contains(rec.Header().Get("Allow"), http.MethodHead) {
		t.Errorf("POST /outbox = %d, Allow: %q (its GET writes: no HEAD)", rec.Code, rec.Header().Get("Allow"))
	}
	// A HEAD there is refused inside the middleware chain: logged as the HEAD it was.
	rec = do(e, http.MethodHead, "/outbox")
	if rec.Code != http.StatusMethodNotAllowed || rec.Body.Len() != 0 ||
		!strings.Contains(logs.String(), `"method":"HEAD","uri":"/outbox","status":405`) {
		t.Errorf("HEAD /outbox = %d (%d body bytes); log:\n%s", rec.Code, rec.Body.Len(), logs.String())
	}
}

func TestPanicAndTemplateErrorBecomeErrorPages(t *testing.T) {
	t.Parallel()
	e, logs := newServer(t, nil)
	e.GET("/panics", func(echo.Context) error { panic("kaboom") })
	e.GET("/bad-template", func(c echo.Context) error {
		return render.HTML(c, http.StatusOK, templ.ComponentFunc(func(_ context.Context, w io.Writer) error {
			_, _ = io.WriteString(w, "<p>half a page")
			return errors.New("template exploded")
		}))
	})

	rec := do(e, http.MethodGet, "/panics")
	if rec.Code != 500 {
		t.Fatalf("panic: %d", rec.Code)
	}
	if out := logs.String(); !strings.Contains(out, "kaboom") || !strings.Contains(out, `"stack"`) {
		t.Errorf("panic not logged with its stack: %s", out)
	}

	rec = do(e, http.MethodGet, "/bad-template")
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "half a page") {
		t.Fatalf("template error: %d %q; want a clean 500 page without the partial output", rec.Code, rec.Body)
	}
	doc, _ := goquery.NewDocumentFromReader(rec.Body)
	if doc.Find(`[data-testid="error-status"]`).Text() != "500" {
		t.Errorf("template error did not render the error page")
	}
	if !strings.Contains(logs.String(), "template exploded") {
		t.Errorf("template error not logged")
	}
}
