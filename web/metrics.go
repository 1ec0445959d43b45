package web

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"pitlane/live"
	"pitlane/payments"
)

// Metrics is the process's Prometheus registry (its own, not the global default, so tests can
// build several servers) and the instruments the wiring reports to. GET /metrics serves it.
//
// What is measured where:
//   - HTTP requests by method, route and status: middleware here. Every label value is bounded:
//     a method outside the standard ones is "other", a path no route matches is "unmatched",
//     so made-up requests cannot grow the series (contract: "Label values never come from
//     unbounded client input").
//   - Gateway calls by operation and outcome: a decorator around the Gateway
//     (payments/gateway/gwmetrics), registered on Registry by the wiring.
//   - Sessions by status, the sweepers' backlog (due sessions, how overdue the oldest is, leases
//     held), open finance cases, unprocessed webhook events: read from the database at scrape
//     time with a short timeout, through payments.Service.CachedStats: counted at most once per
//     statsMaxAge across all replicas' scrapes, the others read the stored counts;
//     pitlane_stats_up says whether that worked. These are of the whole database, the same on
//     every replica.
//   - Stuck money per currency (the finance workbench's sessions past their settle time; at most
//     payments.MaxStuckCurrencies label values) comes from the same cached count.
//   - Requests refused because of their idempotency key: a counter here, told by
//     payments.IdempotencyConfig.OnConflict.
//   - Each replica's patrol (heartbeat, last sweep, back-off, leases in flight): from the
//     heartbeat rows every patrol writes each round (metrics_patrol.go).
//   - This host's clock against the database's: ObserveHostClock.
type Metrics struct {
	Registry *prometheus.Registry

	httpRequests  *prometheus.CounterVec
	httpDuration  *prometheus.HistogramVec
	idemConflicts *prometheus.CounterVec
}

// NewMetrics builds a registry with the Go runtime and process collectors and pitlane's own
// instruments.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pitlane_http_requests_total",
			Help: "HTTP requests by method, route pattern and status.",
		}, []string{"method", "route", "status"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pitlane_http_request_duration_seconds",
			Help:    "HTTP request latency by method and route pattern.",
			Buckets: prometheus.DefBuckets,
		}, []string{"method", "route"}),
		idemConflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pitlane_idempotency_conflicts_total",
			Help: "API requests refused because of their idempotency key: reason in_progress (409, the key's first request still runs) or reused (422, the key was used with another request); kind key (Idempotency-Key) or intent (derived from a keyless request).",
		}, []string{"kind", "reason"}),
	}
	// Every label pair exists from the start (at 0), so rate() sees the first conflict.
	for _, kind := range []payments.IdempotencyKind{payments.IdempotencyClientKey, payments.IdempotencyIntentKey} {
		for _, reason := range []string{payments.ConflictInProgress, payments.ConflictReused} {
			m.idemConflicts.WithLabelValues(string(kind), reason)
		}
	}
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.httpRequests, m.httpDuration, m.idemConflicts,
	)
	return m
}

// ObserveHostClock reports this host's clock against the database's
// (payments.DatabaseClock.HostOffset) as pitlane_host_clock_offset_seconds. pitlane's own
// times follow the database's whatever this says; the host's logs and other programs do not.
// Before the database's clock was first read it is NaN: nothing is known.
func (m *Metrics) ObserveHostClock(offset func() (time.Duration, bool)) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pitlane_host_clock_offset_seconds",
		Help: "This host's wall clock minus the database's (NaN before the database's clock was first read). pitlane's times (leases, expiries) follow the database's clock; pitlane_patrol_clock_offset_seconds is what remains after that correction.",
	}, func() float64 {
		d, ok := offset()
		if !ok {
			return math.NaN()
		}
		return d.Seconds()
	}))
}

// idempotencyConflict counts one request refused because of its key (payments.IdempotencyConfig
// OnConflict). Both labels come from constants of payments, never from the request.
func (m *Metrics) idempotencyConflict(kind payments.IdempotencyKind, reason string) {
	m.idemConflicts.WithLabelValues(string(kind), reason).Inc()
}

// Router serves GET /metrics alone, for a listener of its own (METRICS_ADDR; web.Deps
// MetricsElsewhere then keeps it off the public router).
func (m *Metrics) Router(log *slog.Logger) *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.GET("/metrics", m.handler(log))
	return e
}

// handler serves the registry in the Prometheus text format (or OpenMetrics when asked).
func (m *Metrics) handler(log *slog.Logger) echo.HandlerFunc {
	h := promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      m.Registry, // promhttp_metric_handler_errors_total
	})
	return echo.WrapHandler(h)
}

// middleware counts and times every request by its route pattern (c.Path(): "/api/v1/payments/:id",
// never the raw URL, so the number of series stays bounded). It runs outside the request logger,
// whose HandleError has already turned an error into the response, so the status is final.
func (m *Metrics) middleware() echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			route := c.Path()
			if route == "" {
				route = "unmatched"
			}
			status := c.Response().Status
			if !c.Response().Committed && err != nil {
				// Nobody wrote the response yet (no error handler ran below us).
				status = http.StatusInternalServerError
				if he, ok := err.(*echo.HTTPError); ok {
					status = he.Code
				}
			}
			method := methodLabel(c.Request().Method)
			m.httpRequests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
			m.httpDuration.WithLabelValues(method, route).Observe(time.Since(start).Seconds())
			return err
		}
	}
}

// methodLabel bounds the method label: the standard methods as they are, anything else (a client
// may send any token as a method) "other".
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

// statsMaxAge is how old the database counts of a scrape may be: Prometheus scrapes every few
// seconds per replica, and a count a few seconds old is as good for an alert.
const statsMaxAge = 5 * time.Second

// statsCollector reads payments.Service.CachedStats at scrape time.
type statsCollector struct {
	svc     *payments.Service
	timeout time.Duration
	log     *slog.Logger

	up, sessions, flagged, due, overdue, leased, cases, events, pushFailures, pushLag *prometheus.Desc
	failingMessages, oldestFailingMessage                                             *prometheus.Desc
	stuckSessions, stuckAmount, oldestCase, oldestEvent                               *prometheus.Desc
}

func newStatsCollector(svc *payments.Service, log *slog.Logger) *statsCollector {
	return &statsCollector{
		svc:      svc,
		timeout:  2 * time.Second,
		log:      log,
		up:       prometheus.NewDesc("pitlane_stats_up", "1 when the database answered the counts below at this scrape, 0 otherwise.", nil, nil),
		sessions: prometheus.NewDesc("pitlane_sessions", "Payment sessions by status (whole database).", []string{"status"}, nil),
		flagged:  prometheus.NewDesc("pitlane_sessions_flagged", "Active sessions the sweeper gave up on, waiting for finance (whole database).", nil, nil),
		due:      prometheus.NewDesc("pitlane_sweeper_due_sessions", "Active sessions due for the sweeper and not leased: its backlog (whole database).", nil, nil),
		overdue:  prometheus.NewDesc("pitlane_sweeper_oldest_due_seconds", "How overdue the oldest due session is; grows when no replica sweeps (whole database).", nil, nil),
		leased:   prometheus.NewDesc("pitlane_sweeper_leased_sessions", "Sessions a sweeper holds a live lease on right now (whole database).", nil, nil),
		cases:    prometheus.NewDesc("pitlane_finance_cases_open", "Open finance cases by kind (whole database).", []string{"kind"}, nil),
		events:   prometheus.NewDesc("pitlane_webhook_events_unprocessed", "Verified webhook events of the configured gateway not yet applied (whole database; a gateway before a switch of GATEWAY is not counted).", nil, nil),
		oldestCase: prometheus.NewDesc("pitlane_finance_cases_oldest_open_seconds",
			"How long the oldest open finance case of each kind has waited (whole database; a kind with no open case has no series).", []string{"kind"}, nil),
		oldestEvent: prometheus.NewDesc("pitlane_webhook_events_oldest_unprocessed_seconds",
			"How long the oldest verified webhook event not yet applied has waited since it was first received; 0 when none waits (the configured gateway's, whole database).", nil, nil),
		pushFailures: prometheus.NewDesc("pitlane_events_webhook_failures",
			"Failed POSTs in a row of the events webhook (EVENTS_WEBHOOK_URL); 0 when it delivers or is off (whole database).", nil, nil),
		failingMessages: prometheus.NewDesc("pitlane_customer_messages_failing",
			"Customer messages (one-time codes) whose delivery to NOTIFY_WEBHOOK_URL failed and that are not delivered since (whole database).", nil, nil),
		oldestFailingMessage: prometheus.NewDesc("pitlane_customer_messages_oldest_failing_seconds",
			"How long the oldest customer message whose delivery failed has waited since it was written; 0 when none (whole database).", nil, nil),
		pushLag: prometheus.NewDesc("pitlane_events_webhook_lag_seconds",
			"How long the oldest event the events webhook has not delivered yet has waited; 0 when none waits or delivery never began (whole database).", nil, nil),
		stuckSessions: prometheus.NewDesc("pitlane_stuck_sessions",
			"Stuck sessions (active longer than the expected settle time, the finance workbench's list) by currency; at most 20 currencies, the rest as \"other\" (whole database).", []string{"currency"}, nil),
		stuckAmount: prometheus.NewDesc("pitlane_stuck_amount",
			"The money of those sessions in the currency's minor units (cents), by currency; \"other\" mixes currencies (whole database).", []string{"currency"}, nil),
	}
}

func (s *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.up
	ch <- s.sessions
	ch <- s.flagged
	ch <- s.due
	ch <- s.overdue
	ch <- s.leased
	ch <- s.cases
	ch <- s.oldestCase
	ch <- s.events
	ch <- s.oldestEvent
	ch <- s.pushFailures
	ch <- s.pushLag
	ch <- s.failingMessages
	ch <- s.oldestFailingMessage
	ch <- s.stuckSessions
	ch <- s.stuckAmount
}

func (s *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	st, err := s.svc.CachedStats(ctx, statsMaxAge)
	if err != nil {
		s.log.Warn("metrics: database counts unavailable", "err", err)
		ch <- prometheus.MustNewConstMetric(s.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(s.up, prometheus.GaugeValue, 1)
	for status, n := range st.Sessions {
		ch <- prometheus.MustNewConstMetric(s.sessions, prometheus.GaugeValue, float64(n), string(status))
	}
	ch <- prometheus.MustNewConstMetric(s.flagged, prometheus.GaugeValue, float64(st.FlaggedSessions))
	ch <- prometheus.MustNewConstMetric(s.due, prometheus.GaugeValue, float64(st.DueSessions))
	ch <- prometheus.MustNewConstMetric(s.overdue, prometheus.GaugeValue, st.OldestDue.Seconds())
	ch <- prometheus.MustNewConstMetric(s.leased, prometheus.GaugeValue, float64(st.LeasedSessions))
	for kind, n := range st.OpenCases {
		ch <- prometheus.MustNewConstMetric(s.cases, prometheus.GaugeValue, float64(n), kind)
	}
	for kind, age := range st.OldestOpenCase {
		ch <- prometheus.MustNewConstMetric(s.oldestCase, prometheus.GaugeValue, age.Seconds(), kind)
	}
	ch <- prometheus.MustNewConstMetric(s.events, prometheus.GaugeValue, float64(st.UnprocessedEvents))
	ch <- prometheus.MustNewConstMetric(s.oldestEvent, prometheus.GaugeValue, st.OldestUnprocessedEvent.Seconds())
	ch <- prometheus.MustNewConstMetric(s.pushFailures, prometheus.GaugeValue, float64(st.EventsWebhookFailures))
	ch <- prometheus.MustNewConstMetric(s.pushLag, prometheus.GaugeValue, st.EventsWebhookLag.Seconds())
	ch <- prometheus.MustNewConstMetric(s.failingMessages, prometheus.GaugeValue, float64(st.FailingMessages))
	ch <- prometheus.MustNewConstMetric(s.oldestFailingMessage, prometheus.GaugeValue, st.OldestFailingMessage.Seconds())
	for _, m := range st.Stuck {
		ch <- prometheus.MustNewConstMetric(s.stuckSessions, prometheus.GaugeValue, float64(m.Sessions), m.Currency)
		ch <- prometheus.MustNewConstMetric(s.stuckAmount, prometheus.GaugeValue, float64(m.Amount), m.Currency)
	}
}

// registerLive reports this replica's live listener and its streams: an alert on the listener
// being down for long (pages poll meanwhile; see docs/operations.md).
func registerLive(reg *prometheus.Registry, hub *live.Hub) error {
	up := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pitlane_live_listener_up",
		Help: "1 while this replica's live listener LISTENs on its connection or rests with no console page open, 0 while it reconnects (pages poll meanwhile).",
	}, func() float64 {
		if hub.Up() {
			return 1
		}
		return 0
	})
	streams := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pitlane_live_streams",
		Help: "Live console streams (pages open in a browser) served by this replica.",
	}, func() float64 {
		n, _ := hub.Stats()
		return float64(n)
	})
	for _, c := range []prometheus.Collector{up, streams} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register live gauges: %w", err)
		}
	}
	return nil
}
