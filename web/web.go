// Package web is pitlane's HTTP server: Echo setup, middleware, the one error handler and the
// routes (all in routes.go). Handlers live in package handlers; pages in package views.
package web

import (
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/otel/trace"

	"pitlane/access"
	"pitlane/handlers"
	"pitlane/payments"
)

// Deps is everything the server needs from the wiring in cmd/pitlane. Add a field here when a
// handler needs a new service; New passes Deps to the route registration.
type Deps struct {
	// Logger receives the request log and internal errors. Default: slog.Default().
	Logger *slog.Logger
	// DB is the database pool (readiness, and whatever the handlers need). Nil: never ready.
	DB *pgxpool.Pool
	// ReplicaID names this replica on pages and in logs.
	ReplicaID string
	// SecretKey keys HMACs (CSRF tokens, one-time codes); the same on every replica.
	SecretKey []byte
	// SecureCookies marks the console's cookies Secure: set it when PUBLIC_BASE_URL is https.
	SecureCookies bool
	// HSTS sends Strict-Transport-Security on every response: set it when PUBLIC_BASE_URL is
	// https (browsers then never try plain http on this host again).
	HSTS bool
	// TrustedProxies (TRUSTED_PROXIES) are the peers whose X-Forwarded-For is believed when the
	// client's address is needed (sign-in throttle, logs). Empty: the peer's own address, and
	// X-Forwarded-For is ignored, whoever sends it.
	TrustedProxies []*net.IPNet
	// Access is who may do what (staff users, API keys, sign-in throttle). Nil with a DB: New
	// builds one on DB with the clock of Payments (the system clock without Payments).
	Access *access.Service
	// MetricsElsewhere: /metrics is served on its own listener (METRICS_ADDR, MetricsHandler),
	// not on this router.
	MetricsElsewhere bool
	// Payments is the locking core the JSON API drives. Nil: /api/v1 answers 503.
	Payments *payments.Service
	// Idempotency configures the API's idempotency keys; set StaleAfter from GATEWAY_TIMEOUT
	// (payments.StaleAfterFor). Zero values are the defaults.
	Idempotency payments.IdempotencyConfig
	// Webhooks configures the gateway webhook receiver (the gateway adapter's verifier).
	Webhooks handlers.WebhookConfig
	// Metrics is the process's Prometheus registry, served at /metrics. Nil: New makes one.
	Metrics *Metrics
	// MerchantName (MERCHANT_NAME) is whom customers pay, shown on every checkout page and the
	// checkout's error pages. "": handlers.DefaultMerchantName.
	MerchantName string
	// TracerProvider makes the server span of each request (tracing.go). Nil: the global
	// provider, a no-op unless the process installed one.
	TracerProvider trace.TracerProvider
}

// New builds the Echo instance with middleware, error handler and routes.
func New(d Deps) *echo.Echo {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = errorHandler(d.Logger, d.ReplicaID, handlers.MerchantName(d.MerchantName))

	e.IPExtractor = ipExtractor(d.TrustedProxies)

	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if d.Payments != nil {
		if err := d.Metrics.Registry.Register(newStatsCollector(d.Payments, d.Logger)); err != nil {
			d.Logger.Warn("metrics: database counts not registered", "err", err)
		}
		if err := d.Metrics.Registry.Register(newPatrolCollector(d.Payments, d.Logger)); err != nil {
			d.Logger.Warn("metrics: patrol heartbeats not registered", "err", err)
		}
	}
	if d.Access == nil && d.DB != nil {
		var clock payments.Clock
		if d.Payments != nil {
			clock = clockFunc(d.Payments.Now)
		}
		d.Access = access.New(d.DB, clock)
	}

	// Order matters: security headers first, so every answer carries them (errors, 404s, static
	// files); the request id next so every later line carries it; metrics outside the logger,
	// whose HandleError has made the response by the time they look at its status; the logger
	// outside recovery so a panic is logged as the 500 it becomes.
	e.Use(securityHeaders(d.HSTS))
	e.Use(middleware.RequestID())
	e.Use(tracing(d.TracerProvider)) // outside the logger: its span is in the request's log line
	e.Use(d.Metrics.middleware())
	e.Use(requestLogger(d.Logger))
	e.Use(recoverer())

	routes(e, d)
	return e
}

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
