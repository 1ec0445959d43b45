package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
)

// TestStuckQueriesUseIndexesAtScale fills payment_sessions the way a payment service that has
// run for a while looks — most sessions settled, 2% active — and asks PostgreSQL for the plans
// of every workbench query (each order, each filter, a page after a cursor, the totals): none
// may read payment_sessions with a sequential scan, and the list must walk the partial index of
// its order. The plans are taken both as custom plans (the values known) and as generic plans
// (what a prepared statement may switch to after five executions), because pgx prepares and
// caches every query. make test fills 200 000 sessions; make polygon (PITLANE_SCALE=full) a
// million. enable_seqscan stays on: the planner must choose the index, not be forced to it.
func TestStuckQueriesUseIndexesAtScale(t *testing.T) {
	t.Parallel()
	n := planScale()
	pool := testdb.New(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fillSessions(t, pool, n, now)

	var page []string // a cursor from a real first page, per order
	for _, sort := range []StuckSort{StuckByAge, StuckByAmount} {
		f, _ := StuckFilter{Sort: sort, Limit: 5}.normalize()
		sql, args, err := stuckListSQL(f, now)
		if err != nil {
			t.Fatal(err)
		}
		var s Session
		if err := pool.QueryRow(ctx, `SELECT id::text, created_at, amount, currency FROM (`+sql+`) p ORDER BY 1 LIMIT 1`, args...).
			Scan(&s.ID, &s.CreatedAt, &s.Amount, &s.Currency); err != nil {
			t.Fatal(err)
		}
		page = append(page, f.cursor(s))
	}

	// Each filter, and the index its list must walk when that index is the only good plan (the
	// unselective filters). With a selective filter the planner may rightly prefer another index
	// over active sessions (the sweeper's, the status index) and sort the few rows it finds.
	filters := map[string]struct {
		f     StuckFilter
		index string
	}{
		"age":                        {StuckFilter{}, "payment_sessions_stuck_by_age"},
		"amount":                     {StuckFilter{Sort: StuckByAmount}, "payment_sessions_stuck_by_currency_amount"},
		"age, page 2":                {StuckFilter{After: page[0]}, "payment_sessions_stuck_by_age"},
		"amount, page 2":             {StuckFilter{Sort: StuckByAmount, After: page[1]}, "payment_sessions_stuck_by_currency_amount"},
		"older than a day":           {StuckFilter{MinAge: 24 * time.Hour}, "payment_sessions_stuck_by_age"},
		"not flagged":                {StuckFilter{Flagged: FlagNot, Sort: StuckByAmount}, "payment_sessions_stuck_by_currency_amount"},
		"state":                      {StuckFilter{Status: StatusUnknown}, ""},
		"currency by amount":         {StuckFilter{Currency: "JPY", Sort: StuckByAmount}, ""},
		"currency by amount, page 2": {StuckFilter{Currency: "EUR", Sort: StuckByAmount, After: "EUR_1000_00000000-0000-0000-0000-000000000000"}, ""},
		"flagged":                    {StuckFilter{Flagged: FlagFlagged}, ""},
		"all filters":                {StuckFilter{Status: StatusRegistered, Currency: "EUR", Flagged: FlagNot, MinAge: time.Hour}, ""},
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for name, c := range filters {
			f, err := c.f.normalize()
			if err != nil {
				t.Fatal(err)
			}
			sql, args, err := stuckListSQL(f, now)
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, mode+" list "+name, explain(t, conn.Conn(), sql, args), c.index)
			tsql, targs := stuckTotalsSQL(f, now)
			checkPlan(t, mode+" totals "+name, explain(t, conn.Conn(), tsql, targs), "")
			// When the next session joins the list by age (the page's live refresh).
			jsql, jargs := stuckJoinsSQL(f, now)
			checkPlan(t, mode+" joins "+name, explain(t, conn.Conn(), jsql, jargs), "")
		}
		// The flagged page's sessions, a page after a cursor and their count.
		checkPlan(t, mode+" flagged", explain(t, conn.Conn(), flaggedSessionsSQL(false), nil), "")
		checkPlan(t, mode+" flagged, page 2", explain(t, conn.Conn(), flaggedSessionsSQL(true), []any{now, "00000000-0000-0000-0000-000000000000"}), "")
		checkPlan(t, mode+" flagged count", explain(t, conn.Conn(), flaggedSessionsCountSQL, nil), "")
		// The dashboard's stuck card, likewise: when the next session turns late.
		checkPlan(t, mode+" dashboard next late", explain(t, conn.Conn(), dashboardNextLateSQL, []any{now.Add(-StuckAfter)}), "payment_sessions_due")
	}
}

// planScale is how many sessions a plan test fills: 100 000 in make test, a million in make
// polygon (PITLANE_SCALE=full).
func planScale() int {
	if os.Getenv("PITLANE_SCALE") == "full" {
		return 1_000_000
	}
	return 100_000
}

// fillSessions writes n sessions straight into the table (the core's paths would take minutes):
// 98% settled, 2% active in every state, four currencies, ages up to a few days, a few gateway
// calls, flags and cases per active session.
func fillSessions(t *testing.T, pool *pgxpool.Pool, n int, now time.Time) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, sql := range []string{
		`INSERT INTO orders (order_id, created_at, updated_at)
		SELECT 'o-' || i, $2::timestamptz, $2::timestamptz FROM generate_series(1, $1::int) i`,
		`INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, gateway_payment_id, next_check_at,
			check_attempts, flagged_at, flag_reason, created_at, updated_at)
		SELECT gen_random_uuid(), 'o-' || i, 100 + (i::bigint * 7919) % 500000, (ARRAY['EUR', 'USD', 'GBP', 'JPY'])[1 + i % 4],
			CASE WHEN i % 50 = 0 THEN (ARRAY['Registering', 'Registered', 'Unknown', 'Authorized', 'Canceling'])[1 + (i / 50) % 5]
			     ELSE (ARRAY['Completed', 'Failed', 'Canceled'])[1 + i % 3] END,
			'fake', 'gp_' || i, $2::timestamptz + interval '5 seconds', i % 17,
			CASE WHEN i % 350 = 0 THEN $2::timestamptz END, CASE WHEN i % 350 = 0 THEN 'schedule ran out' END,
			$2::timestamptz - (i % 300000) * interval '1 second', $2::timestamptz
		FROM generate_series(1, $1::int) i`,
		`INSERT INTO gateway_calls (session_id, operation, outcome, latency_ms, detail, created_at)
		SELECT id, 'status', 'ok', 12, 'gateway says pending', created_at + k * interval '1 minute'
		FROM payment_sessions, generate_series(1, 3) k WHERE status IN ('Registering', 'Registered', 'Unknown', 'Authorized', 'Canceling')`,
		`INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at)
		SELECT id, order_id, 'gateway_mismatch', 'fill', created_at FROM payment_sessions WHERE flagged_at IS NOT NULL`,
		`VACUUM ANALYZE payment_sessions`,
		`VACUUM ANALYZE gateway_calls`,
		`VACUUM ANALYZE finance_cases`,
	} {
		var args []any
		if strings.Contains(sql, "$2") {
			args = []any{n, now}
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("fill: %v\n%s", err, sql)
		}
	}
}

// explain prepares sql on the connection, lets the connection's plan_cache_mode pick a custom
// or generic plan, and returns EXPLAIN's plan of EXECUTE with args written as literals (the
// simple protocol: PREPARE's own $n must reach the server as written).
func explain(t *testing.T, conn *pgx.Conn, sql string, args []any) map[string]any {
	t.Helper()
	return explainWith(t, conn, "FORMAT JSON", sql, args)
}

// explainWith is explain with EXPLAIN's options given ("ANALYZE, FORMAT JSON" runs the
// statement: wrap a write in a transaction that is rolled back).
func explainWith(t *testing.T, conn *pgx.Conn, options, sql string, args []any) map[string]any {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "PREPARE stuck_plan AS "+sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatalf("prepare: %v\n%s", err, sql)
	}
	defer conn.Exec(ctx, "DEALLOCATE stuck_plan", pgx.QueryExecModeSimpleProtocol) //nolint:errcheck
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			args = args[1:] // how pgx sends the statement, not one of its arguments
		}
	}
	lits := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case time.Time:
			lits[i] = "'" + v.UTC().Format(time.RFC3339Nano) + "'::timestamptz"
		case string:
			lits[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case int, int32, int64, bool:
			lits[i] = fmt.Sprint(v)
		case time.Duration:
			lits[i] = fmt.Sprintf("'%d microseconds'::interval", v.Microseconds())
		case nil:
			lits[i] = "NULL"
		default:
			t.Fatalf("explain: no literal for %T", a)
		}
	}
	execute := "EXECUTE stuck_plan"
	if len(lits) > 0 {
		execute += "(" + strings.Join(lits, ", ") + ")"
	}
	var out string
	if err := conn.QueryRow(ctx, "EXPLAIN ("+options+") "+execute, pgx.QueryExecModeSimpleProtocol).Scan(&out); err != nil {
		t.Fatalf("explain: %v\n%s", err, sql)
	}
	var plans []map[string]any
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain output: %v\n%s", err, out)
	}
	return plans[0]["Plan"].(map[string]any)
}

// checkPlan fails on a sequential scan of payment_sessions anywhere in the plan, and, when
// wantIndex is set, unless payment_sessions is read through that index.
func checkPlan(t *testing.T, name string, plan map[string]any, wantIndex string) {
	t.Helper()
	var seq bool
	indexes := map[string]bool{}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Relation Name"] == "payment_sessions" && n["Node Type"] == "Seq Scan" {
			seq = true
		}
		// Bitmap Index Scan nodes name no relation: the index name says whose it is.
		if ix, ok := n["Index Name"].(string); ok && strings.HasPrefix(ix, "payment_sessions") {
			indexes[ix] = true
		}
		if kids, ok := n["Plans"].([]any); ok {
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
	}
	walk(plan)
	js, _ := json.MarshalIndent(plan, "", "  ")
	if seq {
		t.Errorf("%s: sequential scan of payment_sessions:\n%s", name, js)
	} else if wantIndex != "" && !indexes[wantIndex] {
		t.Errorf("%s: payment_sessions read through %v, want %s:\n%s", name, indexes, wantIndex, js)
	} else if len(indexes) == 0 {
		t.Errorf("%s: payment_sessions read through no index:\n%s", name, js)
	}
}
