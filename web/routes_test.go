package web_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/handlers"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// Who may call each route: THE table the route × principal matrix below checks. A route
// registered in routes.go without a row here fails TestRouteAccessMatrix, so nobody adds a route
// without saying who may call it.
type routeRule struct {
	kind  ruleKind
	perm  access.Permission // console
	scope access.Scope      // api
}

type ruleKind int

const (
	public  ruleKind = iota // anyone; no authentication of ours (health, static, sign-in, checkout)
	signed                  // its own authentication (the gateway's webhook signature): the same answer whoever calls
	console                 // a signed-in, enabled staff user whose role has perm
	api                     // a bearer API key with scope
)

func con(p access.Permission) routeRule { return routeRule{kind: console, perm: p} }
func key(s access.Scope) routeRule      { return routeRule{kind: api, scope: s} }

var routeRules = map[string]routeRule{
	"GET /healthz":           {kind: public},
	"GET /readyz":            {kind: public},
	"GET /metrics":           {kind: public}, // METRICS_ADDR moves it off the public port
	"GET /static/*":          {kind: public},
	"GET /api/openapi.json":  {kind: public},
	"POST /webhooks/gateway": {kind: signed},

	"POST /api/v1/orders/:order_id/payments":       key(access.ScopePaymentsWrite),
	"POST /api/v1/orders/:order_id/checkout-links": key(access.ScopePaymentsWrite),
	"GET /api/v1/orders/:order_id":                 key(access.ScopePaymentsRead),
	"GET /api/v1/payments/:id":                     key(access.ScopePaymentsRead),
	"POST /api/v1/payments/:id/check":              key(access.ScopePaymentsWrite),
	"POST /api/v1/payments/:id/cancel":             key(access.ScopePaymentsWrite),
	"POST /api/v1/payments/:id/cancel/confirm":     key(access.ScopePaymentsWrite),
	"POST /api/v1/payments/:id/refunds":            key(access.ScopeRefundsWrite),
	"GET /api/v1/payments/:id/refunds":             key(access.ScopePaymentsRead),
	"GET /api/v1/payments/:id/events":              key(access.ScopePaymentsRead),
	"GET /api/v1/refunds/:id":                      key(access.ScopePaymentsRead),
	"GET /api/v1/events":                           key(access.ScopePaymentsRead),

	"GET /login":   {kind: public},
	"POST /login":  {kind: public},
	"POST /logout": {kind: public},

	"GET /":                                      con(access.PermView),
	"GET /payments":                              con(access.PermView),
	"GET /payments/new":                          con(access.PermOperate),
	"POST /payments":                             con(access.PermOperate),
	"GET /payments/:id":                          con(access.PermView),
	"POST /payments/:id/check":                   con(access.PermOperate),
	"POST /payments/:id/cancel":                  con(access.PermOperate),
	"POST /payments/:id/cancel/:challenge":       con(access.PermOperate),
	"POST /payments/:id/refunds/code":            con(access.PermOperate), // support: the customer confirms with a code
	"POST /payments/:id/refunds/code/:challenge": con(access.PermOperate),
	"POST /payments/:id/refunds":                 con(access.PermResolve), // finance: directly, or four eyes above the limit
	"POST /payments/:id/codes/unlock":            con(access.PermResolve),
	"GET /finance":                               con(access.PermFinance),
	"GET /finance/cases":                         con(access.PermFinance),
	"POST /finance/cases/:id/resolve":            con(access.PermResolve),
	"GET /finance/flagged":                       con(access.PermFinance),
	"POST /finance/flagged/:id/retry":            con(access.PermResolve),
	"POST /finance/flagged/refunds/:id/retry":    con(access.PermResolve),
	"POST /finance/flagged/refunds/:id/propose":  con(access.PermResolve),
	"GET /finance/ledger":                        con(access.PermFinance),
	"GET /finance/ledger.csv":                    con(access.PermFinance),
	"GET /finance/stuck":                         con(access.PermFinance),
	"POST /finance/stuck/check":                  con(access.PermResolve),
	"GET /finance/resolutions":                   con(access.PermFinance),
	"GET /finance/resolutions/new":               con(access.PermResolve),
	"POST /finance/resolutions":                  con(access.PermResolve),
	"POST /finance/resolutions/:id/approve":      con(access.PermResolve),
	"POST /finance/resolutions/:id/reject":       con(access.PermResolve),
	"GET /locks":                                 con(access.PermView),
	"GET /ops":                                   con(access.PermView),
	"POST /ops/events-webhook/retry":             con(access.PermAdmin),
	"GET /outbox":                                con(access.PermAdmin),
	"GET /account":                               con(access.PermView),
	"POST /account/password":                     con(access.PermView),
	"POST /account/sessions":                     con(access.PermView),
	"GET /admin/users":                           con(access.PermAdmin),
	"POST /admin/users/:id/disable":              con(access.PermAdmin),
	"POST /admin/users/:id/enable":               con(access.PermAdmin),
	"POST /admin/users/:id/role":                 con(access.PermAdmin),
	"POST /admin/users/:id/password":             con(access.PermAdmin),
	"GET /admin/audit":                           con(access.PermAdmin),
	"GET /admin/audit.csv":                       con(access.PermAdmin),
	"GET /live/dashboard":                        con(access.PermView),
	"GET /live/payments":                         con(access.PermView),
	"GET /live/payments/:id":                     con(access.PermView),
	"GET /live/locks":                            con(access.PermView),
	"GET /live/finance/stuck":                    con(access.PermFinance),
	"GET /live/finance/cases":                    con(access.PermFinance),
	"GET /live/finance/flagged":                  con(access.PermFinance),
	"GET /live/finance/resolutions":              con(access.PermFinance),
	"GET /live/finance/ledger":                   con(access.PermFinance),

	"GET /checkout/:order_id":        {kind: public},
	"POST /checkout/:order_id":       {kind: public},
	"GET /checkout/:order_id/return": {kind: public},
}

// principal is one caller of the matrix: a browser (cookie jar, CSRF token) that may be signed
// in as a staff user, and may send a bearer API key.
type principal struct {
	name              string
	role              access.Role    // staff: their role
	scopes            []access.Scope // API key: its scopes (nil: no key)
	revoked, disabled bool

	jar    *cookiejar.Jar
	csrf   string
	bearer string
}

var matrixSite, _ = url.Parse("http://matrix.test/")

func (p *principal) do(t *testing.T, e *echo.Echo, method, path string, form url.Values) *httptest.ResponseRecorder {
	t.Helper()
	var r *http.Request
	if form != nil {
		form.Set("csrf_token", p.csrf)
		r = httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		r = httptest.NewRequest(method, path, nil)
	}
	for _, c := range p.jar.Cookies(matrixSite) {
		r.AddCookie(c)
	}
	if p.bearer != "" {
		r.Header.Set("Authorization", "Bearer "+p.bearer)
	}
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, r)
	p.jar.SetCookies(matrixSite, rec.Result().Cookies())
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		if doc, err := goquery.NewDocumentFromReader(strings.NewReader(rec.Body.String())); err == nil {
			if tok, ok := doc.Find(`meta[name="csrf-token"]`).Attr("content"); ok && tok != "" {
				p.csrf = tok
			} else if tok, ok := doc.Find(`input[name="csrf_token"]`).First().Attr("value"); ok && tok != "" {
				p.csrf = tok
			}
		}
	}
	return rec
}

const matrixPassword = "matrix password long enough"

// signIn starts a browser session (the sign-in page's CSRF cookie and token, then the form).
func (p *principal) signIn(t *testing.T, e *echo.Echo, email string) {
	t.Helper()
	p.do(t, e, http.MethodGet, "/login", nil)
	if email == "" {
		return
	}
	if rec := p.do(t, e, http.MethodPost, "/login", url.Values{"email": {email}, "password": {matrixPassword}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("sign in %s: %d %s", email, rec.Code, rec.Body)
	}
	p.do(t, e, http.MethodGet, "/", nil) // the session's CSRF token
}

// refusal says how a request was turned away by authentication or authorisation ("" when not).
func refusal(rec *httptest.ResponseRecorder) string {
	switch {
	case rec.Code == http.StatusUnauthorized:
		return "401"
	case rec.Code == http.StatusForbidden:
		return "403"
	case rec.Code == http.StatusSeeOther && (rec.Header().Get("Location") == "/login" || strings.HasPrefix(rec.Header().Get("Location"), "/login?")):
		return "sign-in"
	}
	return ""
}

// TestRouteAccessMatrix sends every route the real router registers (e.Routes()) as every kind
// of caller: anonymous, each role, a disabled user's live session, an API key of each single
// scope and a revoked key. Each answer must be what routeRules says: a staff page lets exactly
// the roles with its permission through (others 403, no session: to the sign-in page), an API
// call exactly the keys with its scope (others 403, no key: 401), public routes everyone. It
// also checks that the OpenAPI document lists the same scope per operation.
func TestRouteAccessMatrix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	clock := payments.NewManualClock(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	svc := payments.NewService(pool, payments.Config{Gateway: fakegw.New(), Clock: clock, CodeSecret: []byte("matrix-secret"), LockTimeout: 10 * time.Second})
	acc := access.New(pool, clock)
	acc.PasswordCost = 4
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, ReplicaID: "replica-matrix", Payments: svc, Access: acc,
		SecretKey: []byte("matrix-secret-matrix-secret-matrix-secret")})

	cli := payments.Staff{Email: "cli:matrix"}
	for _, u := range []struct {
		email string
		role  access.Role
	}{{"support@matrix.test", access.RoleSupport}, {"finance@matrix.test", access.RoleFinance}, {"admin@matrix.test", access.RoleAdmin},
		{"gone@matrix.test", access.RoleAdmin}} {
		if _, err := acc.CreateUser(ctx, cli, u.email, u.role, matrixPassword); err != nil {
			t.Fatal(err)
		}
	}
	principals := []*principal{
		{name: "anonymous"},
		{name: "support", role: access.RoleSupport},
		{name: "finance", role: access.RoleFinance},
		{name: "admin", role: access.RoleAdmin},
		{name: "disabled admin", role: access.RoleAdmin, disabled: true},
		{name: "revoked key", scopes: access.Scopes, revoked: true},
	}
	for _, sc := range access.Scopes {
		principals = append(principals, &principal{name: "key " + string(sc), scopes: []access.Scope{sc}})
	}
	for _, p := range principals {
		p.jar, _ = cookiejar.New(nil)
		switch {
		case p.role != "" && !p.disabled:
			p.signIn(t, e, string(p.role)+"@matrix.test")
		default:
			p.signIn(t, e, "")
		}
		if p.scopes != nil {
			c, k, err := acc.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, p.name, p.scopes...)
			if err != nil {
				t.Fatal(err)
			}
			if p.revoked {
				if _, err := acc.RevokeAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, c.ID); err != nil {
					t.Fatal(err)
				}
			}
			p.bearer = k
		}
	}

	// Every registered route has a rule, and every rule a route.
	var routes []*echo.Route
	seen := map[string]bool{}
	for _, r := range e.Routes() {
		id := r.Method + " " + r.Path
		if _, ok := routeRules[id]; !ok {
			t.Errorf("route %s has no row in routeRules: say who may call it", id)
			continue
		}
		seen[id] = true
		routes = append(routes, r)
	}
	for id := range routeRules {
		if !seen[id] {
			t.Errorf("routeRules names %s, which routes.go does not register", id)
		}
	}
	// POST /logout ends the caller's session: last. POST /account/sessions starts it again on a
	// new token with a new CSRF token: just before.
	last := strings.NewReplacer("/logout", "~~", "/account/sessions", "~")
	slices.SortFunc(routes, func(a, b *echo.Route) int {
		return strings.Compare(last.Replace(a.Method+a.Path), last.Replace(b.Method+b.Path))
	})

	param := regexp.MustCompile(`:[A-Za-z_]+`)
	fill := func(p string) string {
		p = strings.ReplaceAll(p, ":order_id", "o-matrix")
		p = param.ReplaceAllString(p, "5c1b6a1e-0000-4000-8000-000000000001")
		return strings.ReplaceAll(p, "*", "app.js")
	}
	for _, r := range routes {
		rule, path := routeRules[r.Method+" "+r.Path], fill(r.Path)
		answers := map[string]int{}
		for _, p := range principals {
			if p.disabled {
				// A live session of a user who is disabled from now on: sign in, disable, call.
				if _, err := pool.Exec(ctx, `UPDATE staff_users SET disabled_at = NULL WHERE email = 'gone@matrix.test'`); err != nil {
					t.Fatal(err)
				}
				p.jar, _ = cookiejar.New(nil)
				p.signIn(t, e, "gone@matrix.test")
				if _, err := acc.DisableUser(ctx, cli, "gone@matrix.test"); err != nil {
					t.Fatal(err)
				}
			}
			var form url.Values
			if r.Method != http.MethodGet {
				form = url.Values{}
			}
			rec := p.do(t, e, r.Method, path, form)
			answers[p.name] = rec.Code
			if r.Path == "/account/sessions" {
				p.do(t, e, http.MethodGet, "/account", nil) // the new session's CSRF token, for /logout
			}
			if rule.kind == signed {
				continue
			}
			got, want := refusal(rec), expected(rule, p)
			if rule.kind == public && got == "sign-in" {
				got = "" // a public route may send anyone to the sign-in page (POST /logout does)
			}
			if want == "allowed" && got != "" || want != "allowed" && got != want {
				t.Errorf("%s %s as %s: %d (%s, Location %q), want %s", r.Method, r.Path, p.name, rec.Code, got, rec.Header().Get("Location"), want)
			}
		}
		if rule.kind == signed {
			for name, code := range answers {
				if code != answers["anonymous"] {
					t.Errorf("%s %s: %s got %d, anonymous %d: a signed route must not care who calls", r.Method, r.Path, name, code, answers["anonymous"])
				}
			}
		}
	}

	// The OpenAPI document lists, per operation, the scope the route needs.
	var doc struct {
		Paths map[string]map[string]struct {
			Security []map[string][]string `json:"security"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(handlers.OpenAPIDocument, &doc); err != nil {
		t.Fatal(err)
	}
	brace := regexp.MustCompile(`:([A-Za-z_]+)`)
	for id, rule := range routeRules {
		if rule.kind != api {
			continue
		}
		method, p, _ := strings.Cut(id, " ")
		op := doc.Paths[brace.ReplaceAllString(p, "{$1}")][strings.ToLower(method)]
		if len(op.Security) != 1 || !slices.Equal(op.Security[0]["bearer"], []string{string(rule.scope)}) {
			t.Errorf("OpenAPI %s: security %v, want bearer [%s]", id, op.Security, rule.scope)
		}
	}
}

// expected is what routeRules says p gets: "allowed", or the refusal.
func expected(rule routeRule, p *principal) string {
	switch rule.kind {
	case console:
		switch {
		case p.role == "" || p.disabled:
			return "sign-in"
		case p.role.Can(rule.perm):
			return "allowed"
		default:
			return "403"
		}
	case api:
		switch {
		case p.scopes == nil:
			return "401"
		case p.revoked || !slices.Contains(p.scopes, rule.scope):
			return "403"
		default:
			return "allowed"
		}
	}
	return "allowed"
}
