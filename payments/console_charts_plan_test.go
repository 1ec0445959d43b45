package payments

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
)

// TestOpsChartQueriesUseIndexesAtScale fills the tables the Operations page reads the way a
// service that has run for days looks — sessions mostly settled, three days of session events
// and gateway calls, three days of samples — and asks PostgreSQL for the plans of every query
// of the page and of the patrol's sample, custom and generic (pgx prepares every query): none
// may read payment_sessions, session_events or gateway_calls with a sequential scan; the
// gateway's minutes must go through their created_at index, and the sample's settled count
// through session_events_feed (the transactions since the previous sample's settled_xmin) or,
// after a sample with none (an older version's), session_events_created. It runs the sample
// statement of a new minute under EXPLAIN ANALYZE both ways: only its own branch may read
// session_events. Then it runs it when the minute's row exists: the counts must never run (the
// NOT EXISTS guard is a one-time filter). make test fills 50 000
// sessions and 150 000 events and calls each; make polygon (PITLANE_SCALE=full) a million
// sessions and three million of each.
func TestOpsChartQueriesUseIndexesAtScale(t *testing.T) {
	t.Parallel()
	n := 50_000
	if os.Getenv("PITLANE_SCALE") == "full" {
		n = 1_000_000
	}
	pool := testdb.New(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC)
	fillSessions(t, pool, n, now)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, sql := range []string{
		// Three events per session over the last three days (the terminal one last), each in a
		// transaction of its own as the core writes them (xid growing with created_at), and as
		// many gateway calls, spread evenly; three days of samples, one per minute, written by an
		// older version (no settled_xmin: filled in below).
		`INSERT INTO session_events (session_id, from_status, to_status, actor_kind, created_at, xid)
		SELECT id, NULL, (ARRAY['Registering', 'Registered', status])[k], 'api',
			$1::timestamptz - interval '3 days' + (row_number() OVER () * 3 + k) * (interval '3 days' / ($2::int * 3 + 3)),
			(row_number() OVER () * 3 + k)::text::xid8
		FROM payment_sessions, generate_series(1, 3) k`,
		`INSERT INTO gateway_calls (session_id, operation, outcome, latency_ms, created_at)
		SELECT NULL, 'status', (ARRAY['ok', 'ok', 'ok', 'definitive', 'unknown', 'not_sent'])[1 + i % 6], i % 900,
			$1::timestamptz - interval '3 days' + i * (interval '3 days' / ($2::int * 3))
		FROM generate_series(1, $2::int * 3) i`,
		`INSERT INTO ops_samples (at, taken_at, registering, registered, unknown, authorized, canceling, flagged, due, leased,
			settled_since, completed, failed, canceled)
		SELECT m, m, 1, 2, 3, 4, 5, 6, 7, 8, m - interval '1 minute', 9, 10, 11
		FROM generate_series(date_trunc('minute', $1::timestamptz) - interval '3 days', date_trunc('minute', $1::timestamptz) - interval '1 minute', interval '1 minute') m`,
		`VACUUM ANALYZE session_events`,
		`VACUUM ANALYZE gateway_calls`,
		`VACUUM ANALYZE ops_samples`,
	} {
		var args []any
		if strings.Contains(sql, "$1") {
			args = append(args, now)
		}
		if strings.Contains(sql, "$2") {
			args = append(args, n)
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("fill: %v\n%s", err, sql)
		}
	}

	at := now.Truncate(OpsSampleEvery)
	newMinute := []any{at.Add(time.Minute), now.Add(time.Minute), "plan", opsSampleLookback, OpsSampleEvery}
	type query struct {
		name  string
		sql   string
		args  []any
		index string // must be read through this index ("": any, but no sequential scan)
	}
	big := map[string]bool{"payment_sessions": true, "session_events": true, "gateway_calls": true}
	checkPlans := func(queries []query) {
		t.Helper()
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
				t.Fatal(err)
			}
			for _, q := range queries {
				plan := explain(t, conn.Conn(), q.sql, q.args)
				seq, indexes := planScans(plan)
				js, _ := json.MarshalIndent(plan, "", "  ")
				for rel := range seq {
					if big[rel] {
						t.Errorf("%s, %s: sequential scan of %s:\n%s", mode, q.name, rel, js)
					}
				}
				if q.index != "" && !indexes[q.index] {
					t.Errorf("%s, %s: read through %v, want %s:\n%s", mode, q.name, indexes, q.index, js)
				}
			}
		}
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = auto"); err != nil {
			t.Fatal(err)
		}
	}
	// ranOnly runs the sample statement (rolled back) under EXPLAIN ANALYZE and fails unless
	// index is the only way it read session_events: the other branch's guard kept it from running.
	ranOnly := func(what string, args []any, index string) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		plan := explainWith(t, tx.Conn(), "ANALYZE, FORMAT JSON", opsSampleSQL, args)
		ran := map[string]bool{}
		walkPlan(plan, func(n map[string]any) {
			if n["Relation Name"] == "session_events" && n["Actual Loops"].(float64) > 0 {
				ran[n["Index Name"].(string)] = true
			}
		})
		if len(ran) != 1 || !ran[index] {
			js, _ := json.MarshalIndent(plan, "", "  ")
			t.Errorf("%s: the settled count read session_events through %v, want %s alone:\n%s", what, ran, index, js)
		}
	}

	checkPlans([]query{
		{"sample after an older version's", opsSampleSQL, newMinute, "session_events_created"},
		{"gateway minutes", gatewayMinutesSQL, []any{at.Add(-OpsGatewayWindow + OpsGatewayMinute), now}, "gateway_calls_created"},
		{"samples of the day", opsSamplesSQL, []any{at.Add(-OpsHistory), now}, ""},
		{"leases per replica", replicaLeasesSQL, []any{now}, ""},
	})
	ranOnly("sample after an older version's", newMinute, "session_events_created")
	// Samples of this version: each with the xmin of its minute's events.
	for _, sql := range []string{
		`UPDATE ops_samples SET settled_xmin = (extract(epoch FROM at - ($1::timestamptz - interval '3 days'))
			/ extract(epoch FROM interval '3 days') * ($2::int * 3 + 3))::bigint::text::xid8`,
		`VACUUM ANALYZE ops_samples`,
	} {
		var args []any
		if strings.Contains(sql, "$1") {
			args = []any{now, n}
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("fill: %v\n%s", err, sql)
		}
	}
	checkPlans([]query{{"sample (a new minute)", opsSampleSQL, newMinute, "session_events_feed"}})
	ranOnly("sample (a new minute)", newMinute, "session_events_feed")

	// The minute's row exists: the statement runs (rolled back), and the counts never do.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)       //nolint:errcheck
	prev := at.Add(-time.Minute) // filled above
	plan := explainWith(t, tx.Conn(), "ANALYZE, FORMAT JSON", opsSampleSQL, []any{prev, now, "plan", opsSampleLookback, OpsSampleEvery})
	var ran []string
	walkPlan(plan, func(n map[string]any) {
		rel, _ := n["Relation Name"].(string)
		ix, _ := n["Index Name"].(string)
		if (big[rel] || (ix != "" && ix != "ops_samples_pkey")) && n["Actual Loops"].(float64) > 0 {
			ran = append(ran, strings.TrimSpace(n["Node Type"].(string)+" "+rel+" "+ix))
		}
	})
	if len(ran) > 0 {
		js, _ := json.MarshalIndent(plan, "", "  ")
		t.Errorf("with the minute's sample present the statement still counted: %v\n%s", ran, js)
	}
}

// walkPlan calls fn on every node of an EXPLAIN (FORMAT JSON) plan.
func walkPlan(n map[string]any, fn func(map[string]any)) {
	fn(n)
	if kids, ok := n["Plans"].([]any); ok {
		for _, k := range kids {
			walkPlan(k.(map[string]any), fn)
		}
	}
}

// planScans lists the relations a plan reads with a sequential scan and the indexes it uses.
func planScans(plan map[string]any) (seq, indexes map[string]bool) {
	seq, indexes = map[string]bool{}, map[string]bool{}
	walkPlan(plan, func(n map[string]any) {
		if rel, ok := n["Relation Name"].(string); ok && n["Node Type"] == "Seq Scan" {
			seq[rel] = true
		}
		if ix, ok := n["Index Name"].(string); ok {
			indexes[ix] = true
		}
	})
	return seq, indexes
}
