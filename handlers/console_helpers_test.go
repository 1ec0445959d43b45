package handlers_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"golang.org/x/crypto/bcrypt"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/live"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// Console tests drive the real router (web.New) so that sessions, CSRF and role checks run as
// in production, with a browser-like agent (cookie jar, CSRF token taken from the pages).

func init() {
	// Sign-ins in tests need not be slow: the cost is stored in each hash, so verification is
	// the same code path.
	access.DefaultPasswordCost = bcrypt.MinCost
}

var consoleT0 = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

const testPassword = "correct horse battery"

// testMerchant is the MERCHANT_NAME of the bench's servers (an ampersand: escaped, not lost).
const testMerchant = "Harbour Books & Co."

// consoleBench is one database, a fake gateway, a manual clock, a service and a server.
type consoleBench struct {
	url    string
	pool   *pgxpool.Pool
	gw     *fakegw.Gateway
	clock  *payments.ManualClock
	svc    *payments.Service
	access *access.Service
	hub    *live.Hub // the live listener every replica of the bench shares
	e      *echo.Echo
	// deps adjusts the web.Deps of replicas built from now on (nil: as in the bench's first).
	deps func(*web.Deps)
}

func newConsoleBench(t testing.TB) *consoleBench {
	t.Helper()
	url := testdb.NewURL(t)
	b := &consoleBench{url: url, pool: testdb.Pool(t, url), gw: fakegw.New(), clock: payments.NewManualClock(consoleT0)}
	b.access = access.New(b.pool, b.clock)
	b.hub = startHub(t, url, live.Config{})
	b.svc, b.e = b.replica(b.pool, "replica-a", b.gw)
	return b
}

// startHub runs a live hub's listener on the database at url until the test ends, and returns
// once it listens.
func startHub(t testing.TB, url string, cfg live.Config) *live.Hub {
	t.Helper()
	listening := make(chan struct{}, 1)
	cfg.ConnString = url
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.OnListen = func(uint32) {
		select {
		case listening <- struct{}{}:
		default:
		}
	}
	hub := live.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		hub.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	select {
	case <-listening:
	case <-time.After(30 * time.Second):
		t.Fatal("the live listener never listened")
	}
	return hub
}

// replica builds another server over a pool of the same database (another replica); mod
// adjusts its core's configuration.
func (b *consoleBench) replica(pool *pgxpool.Pool, id string, gw payments.Gateway, mod ...func(*payments.Config)) (*payments.Service, *echo.Echo) {
	return b.replicaWith(pool, id, gw, b.hub, mod...)
}

// replicaWith is replica with a live hub of its own.
func (b *consoleBench) replicaWith(pool *pgxpool.Pool, id string, gw payments.Gateway, hub *live.Hub, mod ...func(*payments.Config)) (*payments.Service, *echo.Echo) {
	cfg := payments.Config{Gateway: gw, Clock: b.clock, ReplicaID: id,
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second}
	for _, m := range mod {
		m(&cfg)
	}
	svc := payments.NewService(pool, cfg)
	deps := web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, ReplicaID: id, Payments: svc, Access: access.New(pool, b.clock),
		SecretKey: []byte("console-test-secret-console-test-secret"), MerchantName: testMerchant, Live: hub}
	if b.deps != nil {
		b.deps(&deps)
	}
	return svc, web.New(deps)
}

// server serves h (the bench's router, or a wrapper of it) over HTTP until the test ends. Its
// live streams end first (the hub closes, as at a server's shutdown): httptest's Close waits for
// every open request, and a browser's stream is one.
func (b *consoleBench) server(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		b.hub.Close()
		srv.Close()
	})
	return srv
}

func (b *consoleBench) user(t testing.TB, email string, role access.Role) {
	t.Helper()
	if _, err := b.access.CreateUser(context.Background(), payments.Staff{Email: "cli:test"}, email, role, testPassword); err != nil {
		t.Fatal(err)
	}
}

func (b *consoleBench) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", sql, err)
	}
	return n
}

// payment creates a registered session through the core.
func (b *consoleBench) payment(t testing.TB, order string, amount int64) payments.Session {
	t.Helper()
	res, err := b.svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.CreateInput{OrderID: order, Amount: amount, Currency: "EUR", CustomerContact: "cust@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	return res.Session
}

// audits counts audit rows of an action (and target, when given).
func (b *consoleBench) audits(t testing.TB, action, target string) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND ($2 = '' OR target = $2)`, action, target)
}

// agent is a browser: a cookie jar and the CSRF token of the last page it saw.
type agent struct {
	t    testing.TB
	h    http.Handler
	jar  *cookiejar.Jar
	csrf string
	site *url.URL // whose cookies the jar sends: siteURL, or an https one
}

var siteURL, _ = url.Parse("http://console.test/")

func (b *consoleBench) agent(t testing.TB) *agent { return newAgent(t, b.e) }

func newAgent(t testing.TB, h http.Handler) *agent { return newAgentAt(t, h, siteURL) }

// newAgentAt is a browser on site (https: it sends Secure cookies).
func newAgentAt(t testing.TB, h http.Handler, site *url.URL) *agent {
	jar, _ := cookiejar.New(nil)
	return &agent{t: t, h: h, jar: jar, site: site}
}

func (a *agent) do(r *http.Request) *httptest.ResponseRecorder {
	a.t.Helper()
	for _, c := range a.jar.Cookies(a.site) {
		r.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	a.h.ServeHTTP(rec, r)
	a.jar.SetCookies(a.site, rec.Result().Cookies())
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		if doc, err := goquery.NewDocumentFromReader(strings.NewReader(rec.Body.String())); err == nil {
			if tok, ok := doc.Find(`meta[name="csrf-token"]`).Attr("content"); ok && tok != "" {
				a.csrf = tok
			} else if tok, ok := doc.Find(`input[name="csrf_token"]`).First().Attr("value"); ok && tok != "" {
				a.csrf = tok
			}
		}
	}
	return rec
}

func (a *agent) get(path string, headers ...string) *httptest.ResponseRecorder {
	a.t.Helper()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	return a.do(r)
}

// post submits a form with the agent's CSRF token (unless form already has a csrf_token key,
// even an empty one).
func (a *agent) post(path string, form url.Values) *httptest.ResponseRecorder {
	a.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if _, ok := form["csrf_token"]; !ok {
		form.Set("csrf_token", a.csrf)
	} else if form.Get("csrf_token") == "" {
		form.Del("csrf_token")
	}
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return a.do(r)
}

// follow asserts a 303 and loads where it points.
func (a *agent) follow(rec *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	a.t.Helper()
	if rec.Code != http.StatusSeeOther {
		a.t.Fatalf("want 303, got %d: %s", rec.Code, rec.Body)
	}
	loc, _, _ := strings.Cut(rec.Header().Get("Location"), "#") // a browser keeps the fragment to itself
	return a.get(loc)
}

func (a *agent) cookie(name string) *http.Cookie {
	for _, c := range a.jar.Cookies(a.site) {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// login signs in through the sign-in page and lands on the dashboard.
func (a *agent) login(email string) {
	a.t.Helper()
	a.get("/login")
	rec := a.post("/login", url.Values{"email": {email}, "password": {testPassword}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/" {
		a.t.Fatalf("login %s: %d %s %s", email, rec.Code, rec.Header().Get("Location"), rec.Body)
	}
	if rec := a.get("/"); rec.Code != http.StatusOK {
		a.t.Fatalf("dashboard after login: %d", rec.Code)
	}
}

func page(t testing.TB, rec *httptest.ResponseRecorder, status int) *goquery.Document {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body:\n%s", rec.Code, status, rec.Body)
	}
	doc, err := goquery.NewDocumentFromReader(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func testid(id string) string { return fmt.Sprintf(`[data-testid=%q]`, id) }

func text(doc *goquery.Document, id string) string {
	return strings.TrimSpace(doc.Find(testid(id)).Text())
}

func wantText(t testing.TB, doc *goquery.Document, id, want string) {
	t.Helper()
	if got := text(doc, id); !strings.Contains(got, want) {
		t.Fatalf("%s = %q, want it to contain %q", id, got, want)
	}
}

// pastWriteTimeout sends r with the agent's cookies (and, for a form, its CSRF token) to a real
// server of h whose WriteTimeout has passed before the handler writes a byte: a handler that
// does not move its write deadline on answers nothing. It returns the answer and its body.
func (a *agent) pastWriteTimeout(h http.Handler, method, path string, form url.Values) (*http.Response, []byte) {
	a.t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.WriteTimeout = time.Millisecond
	srv.Start()
	a.t.Cleanup(srv.Close)
	var body io.Reader
	if form != nil {
		form.Set("csrf_token", a.csrf)
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, srv.URL+path, body)
	if err != nil {
		a.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, c := range a.jar.Cookies(a.site) {
		req.AddCookie(c)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s past the server's WriteTimeout: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("%s %s past the server's WriteTimeout: body: %v", method, path, err)
	}
	return resp, b
}

// flag flags session id as the patrol does when its schedule runs out (finance's to settle).
func (b *consoleBench) flag(t *testing.T, id string) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'schedule ran out', next_check_at = NULL WHERE id = $1`,
		id, b.clock.Now()); err != nil {
		t.Fatal(err)
	}
}
