package web_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/payments/gateway/gwmetrics"
	"pitlane/web"
)

// TestMetricsServesTextFormat: /metrics is Prometheus text that a Prometheus parser reads, with
// gateway calls by op/outcome, sessions by status, the sweeper's backlog and HTTP requests by route.
func TestMetricsServesTextFormat(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	m := web.NewMetrics()
	fake := fakegw.New()
	gw, err := gwmetrics.Wrap(fake, m.Registry)
	if err != nil {
		t.Fatal(err)
	}
	clock := payments.NewManualClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	svc := payments.NewService(pool, payments.Config{Gateway: gw, Clock: clock, ReplicaID: "replica-metrics", LockTimeout: 10 * time.Second})
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, ReplicaID: "replica-metrics", Payments: svc, Metrics: m})

	ctx := context.Background()
	actor := payments.Actor{Kind: payments.ActorAPI, ID: "t"}
	if _, err := svc.Create(ctx, actor, payments.CreateInput{OrderID: "metrics-1", Amount: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	fake.Fail(fakegw.OpRegister, fakegw.Transient, 1)
	if _, err := svc.Create(ctx, actor, payments.CreateInput{OrderID: "metrics-2", Amount: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	// Both sessions are due for their first look Backoff[0] after their creation; 10 s later the
	// sweeper's backlog is 2, the oldest overdue by 10 s - Backoff[0].
	clock.Advance(10 * time.Second)
	// What waits, and how long: two open late_payment cases (the oldest 20 minutes) beside a
	// resolved one from two hours ago; an event stored 17 minutes ago and not applied beside an
	// older applied one. The alerts read the oldest one's age, not the count.
	now := clock.Now()
	for _, q := range []string{
		`INSERT INTO finance_cases (order_id, kind, detail, created_at) VALUES (NULL, 'late_payment', 'x', $1::timestamptz - interval '20 minutes')`,
		`INSERT INTO finance_cases (order_id, kind, detail, created_at) VALUES (NULL, 'late_payment', 'x', $1::timestamptz - interval '5 minutes')`,
		`INSERT INTO finance_cases (order_id, kind, detail, created_at, resolved_at) VALUES (NULL, 'late_payment', 'x', $1::timestamptz - interval '2 hours', $1)`,
		`INSERT INTO webhook_events (gateway, event_id, received_at, last_received_at) VALUES ('fake', 'ev-waits', $1::timestamptz - interval '17 minutes', $1)`,
		// Left by the gateway before a switch of GATEWAY: no replica retries it, so it does not
		// count (it kept the unprocessed alert on for good).
		`INSERT INTO webhook_events (gateway, event_id, received_at, last_received_at) VALUES ('stripe', 'ev-old-gateway', $1::timestamptz - interval '3 days', $1)`,
		`INSERT INTO webhook_events (gateway, event_id, received_at, last_received_at, processed_at, outcome)
			VALUES ('fake', 'ev-done', $1::timestamptz - interval '1 hour', $1, $1, 'applied')`,
	} {
		if _, err := pool.Exec(ctx, q, now); err != nil {
			t.Fatal(err)
		}
	}
	do(e, http.MethodGet, "/healthz")
	do(e, http.MethodGet, "/healthz")
	do(e, http.MethodGet, "/no/such/page")

	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics = %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("Content-Type %q, want the text format", ct)
	}
	body := rec.Body.String()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("not Prometheus text format: %v\n%s", err, body)
	}
	for _, name := range []string{"pitlane_gateway_calls_total", "pitlane_gateway_call_duration_seconds", "pitlane_sessions",
		"pitlane_sweeper_due_sessions", "pitlane_sweeper_oldest_due_seconds", "pitlane_sweeper_leased_sessions", "pitlane_http_requests_total",
		"pitlane_http_request_duration_seconds", "pitlane_stats_up", "pitlane_sessions_flagged", "go_goroutines"} {
		if families[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	for _, line := range []string{
		`pitlane_gateway_calls_total{gateway="fake",op="register",outcome="ok"} 1`,
		`pitlane_gateway_calls_total{gateway="fake",op="register",outcome="unknown"} 1`,
		`pitlane_sessions{status="Registered"} 1`,
		`pitlane_sessions{status="Unknown"} 1`,
		`pitlane_sessions{status="Completed"} 0`,
		`pitlane_sweeper_due_sessions 2`,
		fmt.Sprintf(`pitlane_sweeper_oldest_due_seconds %g`, (10*time.Second - payments.DefaultBackoff[0]).Seconds()),
		`pitlane_sweeper_leased_sessions 0`,
		`pitlane_stats_up 1`,
		`pitlane_webhook_events_unprocessed 1`,
		`pitlane_webhook_events_oldest_unprocessed_seconds 1020`,
		`pitlane_finance_cases_open{kind="late_payment"} 2`,
		`pitlane_finance_cases_oldest_open_seconds{kind="late_payment"} 1200`,
		`pitlane_events_webhook_failures 0`,
		`pitlane_events_webhook_lag_seconds 0`,
		`pitlane_customer_messages_failing 0`,
		`pitlane_customer_messages_oldest_failing_seconds 0`,
		`pitlane_http_requests_total{method="GET",route="/healthz",status="200"} 2`,
		`pitlane_http_requests_total{method="GET",route="unmatched",status="404"} 1`,
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("missing line %q", line)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// TestMetricsWithoutDatabase: the database counts fail softly (pitlane_stats_up 0), the rest of
// the scrape still works.
func TestMetricsWithoutDatabase(t *testing.T) {
	t.Parallel()
	pool := unreachablePool(t)
	svc := payments.NewService(pool, payments.Config{Gateway: fakegw.New()})
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, Payments: svc})
	rec := do(e, http.MethodGet, "/metrics")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "pitlane_stats_up 0\n") ||
		!strings.Contains(rec.Body.String(), "\ngo_goroutines ") {
		t.Fatalf("/metrics without a database = %d\n%s", rec.Code, rec.Body)
	}
}

// unreachablePool is a pool on a port nothing listens on.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	l := httptest.NewServer(http.NotFoundHandler())
	addr := l.Listener.Addr().String()
	l.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@"+addr+"/x?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestMetricsLabelsAreBounded: 300 requests with made-up methods and paths (what a scanner
// sends) add a handful of series, not one per request: an unknown method is "other", a path no
// route matches is "unmatched". Before, the method label was the raw method and /metrics grew by
// hundreds of KB.
func TestMetricsLabelsAreBounded(t *testing.T) {
	t.Parallel()
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), Payments: offline(t)})
	scrape := func() string { return do(e, http.MethodGet, "/metrics").Body.String() }
	// Every route and label a scrape itself adds is there before the baseline.
	do(e, http.MethodGet, "/no/such/page")
	do(e, "BREW", "/healthz")
	scrape()
	before := scrape()

	rnd := rand.New(rand.NewPCG(11, 11))
	word := func(n int) string {
		const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
		b := make([]byte, 1+rnd.IntN(n))
		for i := range b {
			b[i] = letters[rnd.IntN(len(letters))]
		}
		return string(b)
	}
	paths := []string{"/healthz", "/api/v1/payments/", "/static/", "/checkout/", "/", "/admin/"}
	junk := func() {
		for range 300 {
			method := strings.ToUpper(word(12))
			path := paths[rnd.IntN(len(paths))] + word(20)
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, httptest.NewRequest(method, path+"?"+word(8)+"="+word(8), nil))
		}
	}
	junk()
	after := scrape()
	t.Logf("/metrics: %d bytes before, %d after 300 made-up requests", len(before), len(after))
	// A few new series: method "other" on the routes whose patterns the paths hit (405) and
	// unmatched (404), each a counter and a histogram.
	if grew := len(after) - len(before); grew > 8<<10 {
		t.Fatalf("/metrics grew by %d bytes after 300 made-up requests, want a few KiB:\n%s", grew, after)
	}
	// And no more for 300 others: the series are bounded, only their counts move.
	junk()
	again := scrape()
	if grew := len(again) - len(after); grew > 512 {
		t.Fatalf("/metrics grew by %d more bytes after 300 more made-up requests, want only counts changing:\n%s", grew, again)
	}
	if strings.Contains(after, `method="BREW"`) || !strings.Contains(after, `method="other"`) {
		t.Fatalf("an unknown method is a label value of its own:\n%s", after)
	}
}

// A client that hangs up before its answer (its own timeout, a closed tab) is not a server
// error: its request is counted as 499, not in the 5xx that PitlaneHTTPErrors calls bugs. Here
// the API key's look-up runs on a context the client has already cancelled. Before, each
// hang-up was a 500 (an outside review).
func TestClientHangUpIsNotAServerError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	clock := payments.NewManualClock(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	acc := access.New(pool, clock)
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, Access: acc,
		Payments: payments.NewService(pool, payments.Config{Gateway: fakegw.New(), Clock: clock})})
	_, key, err := acc.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "shop", access.Scopes...)
	if err != nil {
		t.Fatal(err)
	}
	gone, hangUp := context.WithCancel(ctx)
	hangUp()
	req := httptest.NewRequest(http.MethodGet, "/api/v1/payments/5c1b6a1e-0000-4000-8000-000000000001", nil).WithContext(gone)
	req.Header.Set("Authorization", "Bearer "+key)
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	if rec.Code != 499 {
		t.Fatalf("a hung-up request answered %d, want 499\n%s", rec.Code, rec.Body)
	}
	const counted = `pitlane_http_requests_total{method="GET",route="/api/v1/payments/:id",status="499"} 1`
	if m := do(e, http.MethodGet, "/metrics").Body.String(); !strings.Contains(m, counted) || strings.Contains(m, `route="/api/v1/payments/:id",status="5`) {
		t.Fatalf("/metrics without %s, or with a 5xx for the route:\n%s", counted, m)
	}
}
