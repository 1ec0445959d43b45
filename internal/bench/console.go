package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// The console at scale (issue 12): a million sessions (BENCH_SCALE=small: 20,000) seeded with
// COPY — mostly settled, a few percent active, some of those late or flagged for finance, a
// ledger entry per Completed one, and the events, gateway calls, staff actions and messages that
// grow beside them — and the console's pages served by the real router and handlers (web.New:
// sessions, CSRF, roles) to a signed-in admin. Each page's p95 must stay under 100 ms, and no
// statement a page sends may read a table that grows with sessions sequentially: every statement
// of every page is recorded (the pgbench recorder's tracer) and run through EXPLAIN with its own
// arguments.

// consolePages are the pages measured, by name: every console page, and the filters that once
// read a whole table under a generic plan (a search matching nothing, a ledger range ending long
// ago, a currency with no entries, an audit log by a rare actor). now dates the ledger's ranges
// inside the seeded 90 days.
func consolePages(now time.Time) []struct{ name, path string } {
	day := func(daysAgo int) string { return now.AddDate(0, 0, -daysAgo).Format(time.DateOnly) }
	return []struct{ name, path string }{
		{"dashboard", "/"},
		{"payments list", "/payments"},
		{"payments list, status filter", "/payments?status=Failed"},
		{"payments list, rare status", "/payments?status=Canceling"},
		{"payments list, search by order", "/payments?q=ord-00001"},
		{"payments list, search matching nothing", "/payments?q=no-such-order"},
		{"stuck list", "/finance/stuck"},
		{"stuck list, filters", "/finance/stuck?state=Unknown&currency=EUR&flagged=yes&sort=amount"},
		{"finance cases", "/finance/cases"},
		{"finance cases, closed too", "/finance/cases?all=1"},
		{"flagged", "/finance/flagged"},
		{"ledger", "/finance/ledger"},
		{"ledger, one currency, a day long ago", "/finance/ledger?currency=USD&from=" + day(85) + "&to=" + day(85)},
		{"ledger, a currency with no entries", "/finance/ledger?currency=JPY"},
		{"ledger, refunds only", "/finance/ledger?type=RefundIssued"},
		{"resolutions", "/finance/resolutions"},
		{"locks", "/locks"},
		{"operations", "/ops"},
		{"outbox", "/outbox"},
		{"outbox, one payment", "/outbox?payment=" + seededSessionID(980)},
		{"audit log", "/admin/audit"},
		{"audit log, a rare actor", "/admin/audit?actor=" + url.QueryEscape(rareActor)},
		{"audit log, one payment", "/admin/audit?target=" + seededSessionID(990)},
		{"users", "/admin/users"},
		{"payment page, Completed", "/payments/" + seededSessionID(1)},
		{"payment page, flagged Unknown", "/payments/" + seededSessionID(990)},
	}
}

// rareActor signed in once, long ago, among a million staff actions by others.
const rareActor = "rare-admin@example.com"

// seededSessionID is the id seedConsole gives its i-th session (i % 1000 says its state:
// seedConsole's at).
func seededSessionID(i int) string {
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte(fmt.Sprint(i))).String()
}

func consoleAtScale(ctx context.Context, env *Env) ([]Figure, error) {
	n := env.Size(20_000, 1_000_000)
	samples := env.Size(10, 40)
	dbURL, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	started := time.Now()
	if err := seedConsole(ctx, dbURL, n); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	env.Logf("  console: seeded %d sessions in %s", n, time.Since(started).Round(time.Second))

	rec := &recorder{}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	svc := payments.NewService(pool, payments.Config{Gateway: fakegw.New(), ReplicaID: "bench", Logger: slog.New(slog.DiscardHandler)})
	acc := access.New(pool, nil)
	const email, password = "bench-admin@example.com", "bench admin password 1"
	if _, err := acc.CreateUser(ctx, payments.Staff{Email: "cli:bench"}, email, access.RoleAdmin, password); err != nil {
		return nil, err
	}
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, ReplicaID: "bench", Payments: svc, Access: acc,
		SecretKey: []byte(strings.Repeat("c", 40))})
	b := newBrowser(e)
	if err := b.login(email, password); err != nil {
		return nil, err
	}

	explain, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer explain.Close(context.WithoutCancel(ctx))

	var out []Figure
	seqScans := 0
	var offenders []string
	for _, p := range consolePages(time.Now()) {
		rec.start()
		code := b.get(p.path)
		stmts := rec.stop()
		if code != http.StatusOK {
			return nil, fmt.Errorf("%s: GET %s answered %d", p.name, p.path, code)
		}
		for _, st := range stmts {
			table, err := seqScanOfGrowing(ctx, explain, st)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
			if table != "" {
				seqScans++
				offenders = append(offenders, p.name+": "+table+": "+oneLine(st.sql))
			}
		}
		var lat []time.Duration
		for range samples {
			t := time.Now()
			if code := b.get(p.path); code != http.StatusOK {
				return nil, fmt.Errorf("%s: GET %s answered %d", p.name, p.path, code)
			}
			lat = append(lat, time.Since(t))
		}
		p95 := ms(percentile(lat, 95))
		env.Logf("  console: %-32s p50 %6.1f ms  p95 %6.1f ms  (%d statements)", p.name, ms(percentile(lat, 50)), p95, len(stmts))
		out = append(out, Figure{Name: fmt.Sprintf("console at %d sessions: %s p95", n, p.name), Value: p95, Unit: "ms",
			Anchor: "budget 100 ms", AnchorValue: 100, MaxRatio: 1})
	}
	for _, o := range offenders {
		env.Logf("  console: SEQUENTIAL SCAN: %.300s", o)
	}
	out = append(out, Figure{Name: "console: statements with a sequential scan of a table that grows with sessions", Value: float64(seqScans),
		Unit: "statements", Anchor: "none", AnchorValue: 0, MaxValue: bound(0)})
	return out, nil
}

// growing are the tables that grow with sessions and that seedConsole fills: none may be read
// sequentially by a page.
var growing = []string{"payment_sessions", "orders", "accounting_entries", "session_events", "gateway_calls", "audit_log", "outbox"}

// seqScanOfGrowing EXPLAINs one recorded statement with its own arguments (the plan the server
// chooses for those values) and names the growing table it reads sequentially, if any.
// Statements that name none of them, and transaction control, are skipped.
func seqScanOfGrowing(ctx context.Context, conn *pgx.Conn, st statement) (string, error) {
	head := strings.ToUpper(strings.TrimSpace(st.sql))
	if !slices.ContainsFunc(growing, func(t string) bool { return strings.Contains(st.sql, t) }) ||
		!(strings.HasPrefix(head, "SELECT") || strings.HasPrefix(head, "WITH")) {
		return "", nil
	}
	var plan string
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+st.sql, st.args...).Scan(&plan); err != nil {
		return "", fmt.Errorf("explain %q: %w", oneLine(st.sql), err)
	}
	var doc []struct{ Plan planNode }
	if err := json.Unmarshal([]byte(plan), &doc); err != nil || len(doc) == 0 {
		return "", fmt.Errorf("explain %q: %v", oneLine(st.sql), err)
	}
	for _, t := range growing {
		if doc[0].Plan.seqScanOf(t) {
			return t, nil
		}
	}
	return "", nil
}

type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Plans    []planNode `json:"Plans"`
}

func (p planNode) seqScanOf(rel string) bool {
	if p.NodeType == "Seq Scan" && p.Relation == rel {
		return true
	}
	for _, c := range p.Plans {
		if c.seqScanOf(rel) {
			return true
		}
	}
	return false
}

// browser is a signed-in person: a cookie jar and the CSRF token of the last page, over the router
// itself (no socket: the figure is the handlers' and the database's time).
type browser struct {
	h    http.Handler
	jar  *cookiejar.Jar
	csrf string
}

var consoleURL, _ = url.Parse("http://console.bench/")

func newBrowser(h http.Handler) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{h: h, jar: jar}
}

func (b *browser) do(r *http.Request) *httptest.ResponseRecorder {
	for _, c := range b.jar.Cookies(consoleURL) {
		r.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	b.h.ServeHTTP(rec, r)
	b.jar.SetCookies(consoleURL, rec.Result().Cookies())
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		if doc, err := goquery.NewDocumentFromReader(strings.NewReader(rec.Body.String())); err == nil {
			if tok, ok := doc.Find(`meta[name="csrf-token"]`).Attr("content"); ok && tok != "" {
				b.csrf = tok
			} else if tok, ok := doc.Find(`input[name="csrf_token"]`).First().Attr("value"); ok && tok != "" {
				b.csrf = tok
			}
		}
	}
	return rec
}

func (b *browser) get(path string) int {
	return b.do(httptest.NewRequest(http.MethodGet, path, nil)).Code
}

func (b *browser) login(email, password string) error {
	b.get("/login")
	form := url.Values{"email": {email}, "password": {password}, "csrf_token": {b.csrf}}
	r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if rec := b.do(r); rec.Code != http.StatusSeeOther {
		return fmt.Errorf("sign-in: %d %s", rec.Code, rec.Body.String())
	}
	return nil
}

// seedConsole writes n orders and sessions with COPY: 85 % Completed (with their ledger entry and
// the order Paid), 10 % Failed, 3 % Canceled, 2 % active (Registered, Unknown, Authorized,
// Registering, Canceling), created over the last 90 days; a fifth of the Unknown ones are flagged
// for finance with an open case; the active ones are due at various times, many of them late.
func seedConsole(ctx context.Context, dbURL string, n int) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	now := time.Now().UTC()
	span := 90 * 24 * time.Hour
	type row struct {
		id, order, status string
		created, next     time.Time
		flagged           bool
		amount            int64
		currency          string
	}
	at := func(i int) row {
		r := row{id: seededSessionID(i), order: fmt.Sprintf("ord-%07d", i),
			created: now.Add(-span + time.Duration(i)*span/time.Duration(n)), amount: int64(500 + i%100_000), currency: []string{"EUR", "USD", "GBP"}[i%3]}
		switch k := i % 1000; {
		case k < 850:
			r.status = "Completed"
		case k < 950:
			r.status = "Failed"
		case k < 980:
			r.status = "Canceled"
		case k < 990:
			r.status = "Registered"
		case k < 995:
			r.status, r.flagged = "Unknown", k == 990
		case k < 997:
			r.status = "Authorized"
		case k < 999:
			r.status = "Registering"
		default:
			r.status = "Canceling"
		}
		r.next = r.created.Add(time.Duration(i%48) * time.Hour)
		return r
	}
	active := func(st string) bool {
		return st != "Completed" && st != "Failed" && st != "Canceled"
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	i := 0
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"order_id", "status", "active_session_id", "paid_session_id", "created_at", "updated_at"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i == n {
				return nil, nil
			}
			r := at(i)
			i++
			var act, paid any
			status := "AwaitingPayment"
			switch {
			case r.status == "Completed":
				status, paid = "Paid", r.id
			case active(r.status):
				act = r.id
			}
			return []any{r.order, status, act, paid, r.created, r.created}, nil
		})); err != nil {
		return fmt.Errorf("orders: %w", err)
	}
	i = 0
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"payment_sessions"}, []string{"id", "order_id", "amount", "currency", "status", "gateway",
		"gateway_payment_id", "next_check_at", "flagged_at", "flag_reason", "created_at", "updated_at"},
		pgx.CopyFromFunc(func() ([]any, error) {
			if i == n {
				return nil, nil
			}
			r := at(i)
			i++
			var gp, next, flagged, reason any
			if r.status != "Registering" {
				gp = fmt.Sprintf("gp_seed_%d", i)
			}
			if active(r.status) && !r.flagged {
				next = r.next
			}
			if r.flagged {
				flagged, reason = r.created.Add(time.Hour), "the sweeper's schedule ran out"
			}
			return []any{r.id, r.order, r.amount, r.currency, r.status, "fake", gp, next, flagged, reason, r.created, r.created}, nil
		})); err != nil {
		return fmt.Errorf("sessions: %w", err)
	}
	i = 0
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"accounting_entries"}, []string{"order_id", "session_id", "entry_type", "amount", "currency", "created_at"},
		pgx.CopyFromFunc(func() ([]any, error) {
			for ; i < n; i++ {
				if r := at(i); r.status == "Completed" {
					i++
					return []any{r.order, r.id, "PaymentReceived", r.amount, r.currency, r.created.Add(time.Minute)}, nil
				}
			}
			return nil, nil
		})); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at)
		SELECT id, order_id, 'sweep_exhausted', flag_reason, flagged_at FROM payment_sessions WHERE flagged_at IS NOT NULL`); err != nil {
		return fmt.Errorf("cases: %w", err)
	}
	// What grows beside the sessions: an event and a gateway call for each settled one, a staff
	// action for every tenth (twenty support users, one rare actor once), a delivered message
	// for every fiftieth. gateway_calls' live trigger is off for the load (one NOTIFY per row).
	for _, fill := range []string{
		`INSERT INTO session_events (session_id, from_status, to_status, actor_kind, created_at)
		SELECT id, 'Registered', status, 'patrol', updated_at + interval '30 seconds'
		FROM payment_sessions WHERE status IN ('Completed', 'Failed', 'Canceled')`,
		`ALTER TABLE gateway_calls DISABLE TRIGGER USER`,
		`INSERT INTO gateway_calls (session_id, operation, outcome, http_status, latency_ms, replica_id, created_at)
		SELECT id, 'status', 'ok', 200, 40 + (hashtext(id::text) & 255), 'bench', updated_at + interval '29 seconds'
		FROM payment_sessions WHERE gateway_payment_id IS NOT NULL`,
		`ALTER TABLE gateway_calls ENABLE TRIGGER USER`,
		`INSERT INTO audit_log (at, actor, role, action, target, detail)
		SELECT created_at + interval '1 hour', 'support' || (row_number() OVER () % 20) || '@example.com', 'support', 'payment.check', id::text, 'seeded'
		FROM payment_sessions WHERE hashtext(id::text) % 10 = 0`,
		`INSERT INTO audit_log (at, actor, role, action, target, detail) SELECT min(created_at), '` + rareActor + `', 'admin', 'auth.login', '` + rareActor + `', '' FROM payment_sessions`,
		`INSERT INTO outbox (kind, to_addr, body, redacted_body, order_id, payment_id, created_at, delivered_at, attempts)
		SELECT 'cancel_code', 'customer@example.com', 'Your code: ******', 'Your code: ******', order_id, id, updated_at, updated_at + interval '2 seconds', 1
		FROM payment_sessions WHERE hashtext(id::text) % 50 = 0 OR id = '` + seededSessionID(980) + `'`,
	} {
		if _, err := tx.Exec(ctx, fill); err != nil {
			return fmt.Errorf("fill: %w\n%s", err, fill)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	// COPY fired the count triggers once per row: a million delta rows for the status counts and
	// ~850,000 for the ledger's day totals, which a live system accrues over months while its
	// reads fold them a thousand at a time and autovacuum clears the folded rows behind them.
	// Fold them now (the statements of payments.StatusCounts and TrialBalance) and vacuum, so the
	// pages are measured in that steady state, not on a million dead tuples of the bulk load.
	for _, fold := range []string{
		`WITH gone AS (DELETE FROM session_status_deltas RETURNING status, delta)
			INSERT INTO session_status_deltas (status, delta) SELECT status, sum(delta) FROM gone GROUP BY status`,
		`WITH gone AS (DELETE FROM ledger_day_deltas RETURNING day, currency, received, refunded, entries)
			INSERT INTO ledger_day_deltas (day, currency, received, refunded, entries)
			SELECT day, currency, sum(received), sum(refunded), sum(entries) FROM gone GROUP BY day, currency`,
	} {
		if _, err := conn.Exec(ctx, fold); err != nil {
			return fmt.Errorf("fold: %w", err)
		}
	}
	_, err = conn.Exec(ctx, `VACUUM ANALYZE`)
	return err
}
