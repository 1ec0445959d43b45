// Package web is pitlane's HTTP server: Echo setup, middleware, the one error handler and the
// routes (all in routes.go). Handlers live in package handlers; pages in package views.
package web

import (
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

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
	// Payments is the locking core the JSON API drives. Nil: /api/v1 answers 503.
	Payments *payments.Service
	// Idempotency configures the API's idempotency keys; set StaleAfter from GATEWAY_TIMEOUT
	// (payments.StaleAfterFor). Zero values are the defaults.
	Idempotency payments.IdempotencyConfig
	// Webhooks configures the gateway webhook receiver (the gateway adapter's verifier).
	Webhooks handlers.WebhookConfig
	// Metrics is the process's Prometheus registry, served at /metrics. Nil: New makes one.
	Metrics *Metrics
}

// New builds the Echo instance with middleware, error handler and routes.
func New(d Deps) *echo.Echo {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = errorHandler(d.Logger, d.ReplicaID)

	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if d.Payments != nil {
		if err := d.Metrics.Registry.Register(newStatsCollector(d.Payments, d.Logger)); err != nil {
			d.Logger.Warn("metrics: database counts not registered", "err", err)
		}
	}

	// Order matters: the request id first so every later line carries it; metrics outside the
	// logger, whose HandleError has made the response by the time they look at its status; the
	// logger outside recovery so a panic is logged as the 500 it becomes.
	e.Use(middleware.RequestID())
	e.Use(d.Metrics.middleware())
	e.Use(requestLogger(d.Logger))
	e.Use(recoverer())

	routes(e, d)
	return e
}
