package handlers

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/labstack/echo/v4"

	"pitlane/migrations"
)

// Health answers the load balancer's probes.
type Health struct {
	DB *pgxpool.Pool
	// ClockSynced, when set, is closed once the replica has read the database's clock
	// (payments.DatabaseClock): until then its times would be its host's, so it is not ready.
	ClockSynced <-chan struct{}
	// Stopping, when set, is closed once the replica was told to stop (SIGTERM): it is not ready
	// from then on, so its balancer sends new requests elsewhere while it drains
	// (SHUTDOWN_DRAIN) and finishes those in flight.
	Stopping <-chan struct{}
	// current caches a positive migrations check: a binary's embedded migrations, once all
	// applied, stay applied (a newer replica may add more, which this binary does not know).
	current atomic.Bool
}

// NewHealth returns the probe handlers for db.
func NewHealth(db *pgxpool.Pool) *Health { return &Health{DB: db} }

type healthBody struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Healthz: the process is up and serving HTTP. It deliberately does not touch the database,
// so a database outage makes replicas unready, not dead (and restarted in a loop).
func (h *Health) Healthz(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, healthBody{Status: "ok"})
}

// Readyz: the database answers and takes writes, the replica has read its clock (ClockSynced) and it has every
// migration this binary embeds, so requests routed here can be served. 503 with the reason
// otherwise.
func (h *Health) Readyz(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "no-store")
	if reason := h.notReady(c.Request().Context()); reason != "" {
		return c.JSON(http.StatusServiceUnavailable, healthBody{Status: "unavailable", Reason: reason})
	}
	return c.JSON(http.StatusOK, healthBody{Status: "ready"})
}

func (h *Health) notReady(ctx context.Context) string {
	select {
	case <-h.Stopping: // nil (not set): never
		return "stopping"
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// One round trip that is also a ping: a database that answers but refuses every write (a
	// standby reached during a failover) cannot serve anything routed here either.
	var readOnly string
	if err := h.DB.QueryRow(ctx, `SELECT current_setting('transaction_read_only')`).Scan(&readOnly); err != nil {
		return "database unreachable"
	}
	if readOnly == "on" {
		return "database is read-only (a standby?)"
	}
	if h.ClockSynced != nil {
		select {
		case <-h.ClockSynced:
		default:
			return "the database's clock is not read yet"
		}
	}
	if h.current.Load() {
		return ""
	}
	db := stdlib.OpenDBFromPool(h.DB)
	defer db.Close()
	ok, err := migrations.Current(ctx, db)
	switch {
	case err != nil:
		return "migration status unknown"
	case !ok:
		return "migrations pending"
	}
	h.current.Store(true)
	return ""
}
