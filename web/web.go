// Package web is pitlane's HTTP server: Echo setup, middleware, the one error handler and the
// routes (all in routes.go). Handlers live in package handlers; pages in package views.
package web

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/otel/trace"

	"pitlane/access"
	"pitlane/handlers"
	"pitlane/live"
	"pitlane/payments"
	"pitlane/web/auth"
)

// Deps is everything the server needs from the wiring in cmd/pitlane. Add a field here when a
// handler needs a new service; New passes Deps to the route registration.
type Deps struct {
	// Logger receives the request log and internal errors. Default: slog.Default().
	Logger *slog.Logger
	// DB is the database pool (readiness, sessions, access). Nil: the pool of Payments.
	DB *pgxpool.Pool
	// ReplicaID names this replica on pages and in logs.
	ReplicaID string
	// SecretKey keys HMACs (CSRF tokens, one-time codes); the same on every replica.
	SecretKey []byte
	// SecretKeyFallbacks (SECRET_KEY_FALLBACKS) verify CSRF tokens made under them, sign none.
	SecretKeyFallbacks [][]byte
	// SecureCookies marks the console's cookies Secure: set it when PUBLIC_BASE_URL is https.
	SecureCookies bool
	// ConsoleIdleTimeout (CONSOLE_IDLE_TIMEOUT) signs staff out after this long without a
	// request of their own; 0: auth.DefaultIdleTimeout.
	ConsoleIdleTimeout time.Duration
	// ClockSynced, when set, is closed once the database's clock has been read
	// (payments.DatabaseClock.Synced): /readyz answers 503 until then.
	ClockSynced <-chan struct{}
	// Stopping, when set, is closed once the replica was told to stop: /readyz answers 503
	// "stopping" from then on (handlers.Health.Stopping).
	Stopping <-chan struct{}
	// SessionClock is the console sessions' clock (idle timeout); nil: the wall clock, which
	// sessions live on anyway (their lifetime, the store's expiry). serve passes the database's
	// (payments.DatabaseClock: the idle stamp one replica writes, another reads). Tests move it.
	SessionClock func() time.Time
	// HSTS sends Strict-Transport-Security on every response: set it when PUBLIC_BASE_URL is
	// https (browsers then never try plain http on this host again).
	HSTS bool
	// TrustedProxies (TRUSTED_PROXIES) are the peers whose X-Forwarded-For is believed when the
	// client's address is needed (sign-in throttle, logs). Empty: the peer's own address, and
	// X-Forwarded-For is ignored, whoever sends it.
	TrustedProxies []*net.IPNet
	// Access is who may do what (staff users, API keys, sign-in throttle). Nil: New builds one
	// on DB with the clock of Payments.
	Access *access.Service
	// MetricsElsewhere: /metrics is served on its own listener (METRICS_ADDR, MetricsHandler),
	// not on this router.
	MetricsElsewhere bool
	// Payments is the locking core every handler drives. Required: serve and dev always build
	// it (a missing gateway configuration stops them before a server exists), so no handler
	// has a "no service" mode.
	Payments *payments.Service
	// RequestTimeout bounds the work of every JSON API request (0: none; serve passes
	// RequestTimeoutFor(GATEWAY_TIMEOUT)): a database that does not answer is a 503 within it.
	RequestTimeout time.Duration
	// Idempotency configures the API's idempotency keys; set StaleAfter from GATEWAY_TIMEOUT
	// (payments.StaleAfterFor). Zero values are the defaults.
	Idempotency payments.IdempotencyConfig
	// Webhooks configures the gateway webhook receiver (the gateway adapter's verifier).
	Webhooks handlers.WebhookConfig
	// Metrics is the process's Prometheus registry, served at /metrics. Nil: New makes one.
	Metrics *Metrics
	// Live is the replica's live hub (its listener runs in cmd/pitlane): the console's streams
	// and the positions pages embed. Nil: the streams answer 503 and pages poll.
	Live *live.Hub
	// MerchantName (MERCHANT_NAME) is whom customers pay, shown on every checkout page and the
	// checkout's error pages. "": handlers.DefaultMerchantName.
	MerchantName string
	// TracerProvider makes the server span of each request (tracing.go). Nil: the global
	// provider, a no-op unless the process installed one.
	TracerProvider trace.TracerProvider
}

// New builds the Echo instance with middleware, error handler and routes. It panics without
// Deps.Payments: that is a wiring bug, better found at start-up than as a nil dereference in
// the first request.
func New(d Deps) *echo.Echo {
	if d.Payments == nil {
		panic("web.New: Deps.Payments is required")
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.DB == nil {
		d.DB = d.Payments.DB()
	}
	if d.Access == nil {
		d.Access = access.New(d.DB, clockFunc(d.Payments.Now))
	}
	e := echo.New()
	e.HideBanner = true
	e.JSONSerializer = jsonSerializer{}
	e.HidePort = true
	e.HTTPErrorHandler = errorHandler(d.Logger, d.ReplicaID, handlers.MerchantName(d.MerchantName), d.Payments)

	e.IPExtractor = ipExtractor(d.TrustedProxies)

	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if d.Idempotency.OnConflict == nil {
		d.Idempotency.OnConflict = d.Metrics.idempotencyConflict
	}
	if err := d.Metrics.Registry.Register(newStatsCollector(d.Payments, d.Logger)); err != nil {
		d.Logger.Warn("metrics: database counts not registered", "err", err)
	}
	if err := d.Metrics.Registry.Register(newPatrolCollector(d.Payments, d.Logger)); err != nil {
		d.Logger.Warn("metrics: patrol heartbeats not registered", "err", err)
	}
	if d.Live != nil {
		if err := registerLive(d.Metrics.Registry, d.Live); err != nil {
			d.Logger.Warn("metrics: live gauges not registered", "err", err)
		}
	}

	// Order matters: security headers first, so every answer carries them (errors, 404s, static
	// files); the request id next so every later line carries it; metrics outside the logger,
	// whose HandleError has made the response by the time they look at its status; the logger
	// outside recovery so a panic is logged as the 500 it becomes.
	e.Pre(headAsGet)
	e.Use(securityHeaders(d.HSTS))
	e.Use(crossSiteGetWithEffects)
	e.Use(ownRequestIDs)
	e.Use(middleware.RequestID())
	e.Use(tracing(d.TracerProvider)) // outside the logger: its span is in the request's log line
	e.Use(d.Metrics.middleware())
	e.Use(requestLogger(d.Logger))
	e.Use(recoverer())
	e.Use(refuseHeadWithEffects)

	routes(e, d)
	return e
}

// jsonSerializer is Echo's JSON serializer without HTML escaping: a checkout link's url came
// back as "…/checkout/o-1?amount=1999\u0026currency=EUR", and pasted from a terminal it opened
// the bad-link page (an outside review of the docs' examples). Every JSON answer is
// application/json or problem+json with nosniff, never read as HTML.
type jsonSerializer struct{ echo.DefaultJSONSerializer }

func (jsonSerializer) Serialize(c echo.Context, i any, indent string) error {
	enc := json.NewEncoder(c.Response())
	enc.SetEscapeHTML(false)
	if indent != "" {
		enc.SetIndent("", indent)
	}
	return enc.Encode(i)
}

// headAsGet answers HEAD wherever GET is served (RFC 9110 §9.3.2; load balancers and monitors
// probe with it): the request is routed and handled as the GET (Echo routes on the request
// itself, so its method is changed in place for the handler's run), and what the handler
// writes as a body is dropped, so the answer is the GET's status and headers alone. The method
// is HEAD again before the error handler and net/http see the response.
//
// Not where the GET does more than read: the outbox marks the codes it shows as seen by the
// viewer (who may then not confirm them), and the CSV exports write an audit entry and read
// every row. A HEAD there would do that for a body nobody gets: 405, Allow: GET, answered by
// refuseHeadWithEffects inside the middleware chain (from here, before it, the refusal went out
// without the security headers, a request id, a log line or metrics: an outside review).
func headAsGet(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Method != http.MethodHead {
			return next(c)
		}
		if getWithEffects[r.URL.Path] {
			c.Set(headRefusedKey, true)
		}
		res := c.Response()
		w := res.Writer
		r.Method, res.Writer = http.MethodGet, headWriter{w}
		defer func() { r.Method, res.Writer = http.MethodHead, w }()
		return next(c)
	}
}

// headRefusedKey marks a HEAD of a GET with effects (headAsGet) for refuseHeadWithEffects.
const headRefusedKey = "pitlane.head_refused"

// refuseHeadWithEffects answers headAsGet's refusal (405, Allow: GET) before the GET's
// handler runs, as the innermost of the middlewares every answer passes.
func refuseHeadWithEffects(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if refused, _ := c.Get(headRefusedKey).(bool); refused {
			c.Request().Method = http.MethodHead // what the log line and the metrics name
			c.Response().Header().Set(echo.HeaderAllow, http.MethodGet)
			return echo.NewHTTPError(http.StatusMethodNotAllowed, "HEAD is not served here: the GET does more than read")
		}
		return next(c)
	}
}

// getWithEffects are the GET routes that write something (auth.GetsWithEffects, headAsGet).
var getWithEffects = auth.GetsWithEffects

// crossSiteGetWithEffects refuses a cross-site navigation to a GET that writes (403): the user
// opens the page again from the console. So is a live stream opened by another site's page: a
// page on a sibling subdomain could open EventSource(…, {withCredentials: true}) with the
// staff member's cookie (SameSite=Lax goes along to the same site) and hold their sixteen
// streams for ten minutes at a time, turning their own pages to polling (an outside review).
func crossSiteGetWithEffects(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		guarded := getWithEffects[r.URL.Path] || strings.HasPrefix(r.URL.Path, "/live/")
		// same-site too: a page on a sibling subdomain is another site's page to the console.
		if sfs := r.Header.Get("Sec-Fetch-Site"); guarded && (sfs == "cross-site" || sfs == "same-site") {
			return echo.NewHTTPError(http.StatusForbidden, "this page opens from the console only: a link from another site does not open it")
		}
		return next(c)
	}
}

// ownRequestIDs drops a client's X-Request-Id unless it is a short plain id (at most 64 of
// [A-Za-z0-9._:-]), so that RequestID makes one: the id goes into every log line and the
// answer, and a client could otherwise fill logs with 64 KiB ids or forge another request's.
func ownRequestIDs(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header
		if id := h.Get(echo.HeaderXRequestID); id != "" && !plainRequestID(id) {
			h.Del(echo.HeaderXRequestID)
		}
		return next(c)
	}
}

func plainRequestID(id string) bool {
	if len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch ch := id[i]; {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9', ch == '.', ch == '_', ch == ':', ch == '-':
		default:
			return false
		}
	}
	return true
}

// headWriter drops a body: the answer to a HEAD request.
type headWriter struct{ http.ResponseWriter }

func (w headWriter) Write(p []byte) (int, error) { return len(p), nil }

func (w headWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// clockFunc adapts a time source to payments.Clock.
type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// ipExtractor is how c.RealIP() finds the client: X-Forwarded-For only when the peer is one of
// the trusted proxies (walking the header from the right past trusted hops), the peer's address
// otherwise. Echo's default trusts X-Forwarded-For from anyone, which would let a client name
// its own address to the sign-in throttle.
func ipExtractor(trusted []*net.IPNet) echo.IPExtractor {
	if len(trusted) == 0 {
		return echo.ExtractIPDirect()
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, n := range trusted {
		opts = append(opts, echo.TrustIPRange(n))
	}
	return echo.ExtractIPFromXFFHeader(opts...)
}
