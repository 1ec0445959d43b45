package payments

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
)

// The feed reads session_events and refund_events each through its own (xid, id) index from
// the cursor on, and payment_sessions and refunds by primary key: no sequential scan, and no
// sort but the one of the two branches' first rows (at most 2 × limit), as a custom plan and as
// the generic plan a prepared statement may switch to. make test fills 100 000 sessions with
// two events each, written by 40 transactions, and a refund with two events for every fifth
// Completed one; make polygon (PITLANE_SCALE=full) a million.
//
// One payment's events are read through that payment's own indexes (its timeline's, its
// refunds', their events'), not by walking the whole feed.
func TestFeedReadsByItsIndex(t *testing.T) {
	t.Parallel()
	n := planScale()
	pool := testdb.New(t)
	ctx := context.Background()
	fillSessions(t, pool, n, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	const txs = 40
	for k := range txs { // one xid per statement: the feed's order has many transactions to walk
		if _, err := pool.Exec(ctx, `INSERT INTO session_events (session_id, from_status, to_status, actor_kind, created_at)
			SELECT id, s.from_status, s.to_status, 'api', created_at
			FROM (SELECT id, created_at, row_number() OVER (ORDER BY id) AS i FROM payment_sessions) p,
				(VALUES (NULL, 'Registering'), ('Registering', 'Registered')) s (from_status, to_status)
			WHERE p.i % $1 = $2`, txs, k); err != nil {
			t.Fatal(err)
		}
	}
	fillRefunds(t, pool, txs)
	for _, table := range []string{"session_events", "refunds", "refund_events"} {
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
			t.Fatal(err)
		}
	}
	waitServed(t, pool)
	var midXid string
	var midID int64
	if err := pool.QueryRow(ctx, `SELECT xid::text, id FROM session_events ORDER BY xid, id OFFSET $1 LIMIT 1`, n).Scan(&midXid, &midID); err != nil {
		t.Fatal(err)
	}
	var refunded string
	if err := pool.QueryRow(ctx, `SELECT session_id::text FROM refunds LIMIT 1`).Scan(&refunded); err != nil {
		t.Fatal(err)
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
		// The feed's reads, and the events webhook's count of what waits (eventsAfter: every
		// replica's stats scrape), which read session_events whole once it no longer named the
		// partial index's xid IS NOT NULL (an outside review).
		for name, q := range map[string]struct {
			sql  string
			args []any
		}{
			"from the start":          {feedSQL, []any{"0", int64(0), MaxFeedRead + 1}},
			"from the middle":         {feedSQL, []any{midXid, midID, DefaultFeedRead + 1}},
			"what waits for the shop": {eventsAfterSQL, []any{midXid, midID, EventsWebhookWaitingShown + 1}},
		} {
			var walk func(node map[string]any)
			used := map[any]bool{}
			walk = func(node map[string]any) {
				switch node["Node Type"] {
				case "Seq Scan":
					t.Errorf("%s, %s: Seq Scan of %v in the plan", mode, name, node["Relation Name"])
				case "Sort", "Incremental Sort":
					if scansUnbounded(node) {
						t.Errorf("%s, %s: %s of a table's rows in the plan", mode, name, node["Node Type"])
					}
				}
				used[node["Index Name"]] = true
				for _, k := range planChildren(node) {
					walk(k)
				}
			}
			walk(explain(t, conn.Conn(), q.sql, q.args))
			for _, index := range []string{"session_events_feed", "refund_events_feed", "payment_sessions_pkey", "refunds_pkey"} {
				if !used[index] {
					t.Errorf("%s, %s: %s not used", mode, name, index)
				}
			}
		}
		// One payment's events (GET /api/v1/payments/{id}/events), one with a refund: through
		// the payment's own indexes, never the whole feed's.
		used := map[any]bool{}
		var walk func(node map[string]any)
		walk = func(node map[string]any) {
			if node["Node Type"] == "Seq Scan" {
				t.Errorf("%s, a payment's events: Seq Scan of %v in the plan", mode, node["Relation Name"])
			}
			used[node["Index Name"]] = true
			for _, k := range planChildren(node) {
				walk(k)
			}
		}
		walk(explain(t, conn.Conn(), paymentFeedSQL, []any{"0", int64(0), DefaultFeedRead + 1, refunded}))
		for _, index := range []string{"session_events_session", "refunds_session_id_request_key_key", "refund_events_refund"} {
			if !used[index] {
				t.Errorf("%s, a payment's events: %s not used", mode, index)
			}
		}
		if used["session_events_feed"] || used["refund_events_feed"] {
			t.Errorf("%s, a payment's events: walks the whole feed's index", mode)
		}
	}
}

// waitServed waits until the feed serves every event written so far: until no transaction
// older than them runs in the cluster (feedServes). The planner weighs the feed's bound by the
// oldest running transaction's id when it plans (it evaluates pg_snapshot_xmin to estimate), and
// the test cluster is shared with parallel tests whose open transactions hold it back: behind
// one older than the fill, the feed's index holds nothing to serve, walking it is the cheapest
// plan, and a plan test would judge the plan of an empty feed (TestFeedReadsByItsIndex failed
// in CI that way).
func waitServed(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var waiting bool
		if err := pool.QueryRow(context.Background(), `SELECT
			EXISTS (SELECT 1 FROM session_events WHERE xid >= pg_snapshot_xmin(pg_current_snapshot()))
			OR EXISTS (SELECT 1 FROM refund_events WHERE xid >= pg_snapshot_xmin(pg_current_snapshot()))`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if !waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a transaction in the test cluster has been running for a minute: the feed serves none of the events written since")
		}
	}
}

// eachScan calls fn for every node of an EXPLAIN ANALYZE plan that reads a table, with the rows it
// read: returned or filtered out, over all its loops.
func eachScan(node map[string]any, fn func(rel string, node map[string]any, read float64)) {
	if rel, ok := node["Relation Name"].(string); ok {
		rows, _ := node["Actual Rows"].(float64)
		loops, _ := node["Actual Loops"].(float64)
		removed, _ := node["Rows Removed by Filter"].(float64)
		fn(rel, node, (rows+removed)*max(loops, 1))
	}
	for _, k := range planChildren(node) {
		eachScan(k, fn)
	}
}

func planChildren(node map[string]any) []map[string]any {
	kids, _ := node["Plans"].([]any)
	out := make([]map[string]any, len(kids))
	for i, k := range kids {
		out[i] = k.(map[string]any)
	}
	return out
}

// scansUnbounded reports whether a plan node reads a table other than through a Limit below it.
func scansUnbounded(node map[string]any) bool {
	for _, k := range planChildren(node) {
		typ, _ := k["Node Type"].(string)
		switch {
		case typ == "Limit":
		case strings.HasSuffix(typ, "Scan") && typ != "Subquery Scan":
			return true
		case scansUnbounded(k):
			return true
		}
	}
	return false
}

// fillRefunds refunds every fifth Completed session of fillSessions whole (Succeeded, with its
// two feed events), in txs transactions.
func fillRefunds(t *testing.T, pool *pgxpool.Pool, txs int) {
	t.Helper()
	for k := range txs {
		if _, err := pool.Exec(context.Background(), `WITH r AS (
				INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key, created_at, updated_at)
				SELECT gen_random_uuid(), id, order_id, amount, currency, 'Succeeded', 'fill', created_at, created_at
				FROM (SELECT *, row_number() OVER (ORDER BY id) AS i FROM payment_sessions WHERE status = 'Completed') p
				WHERE p.i % 5 = 0 AND p.i / 5 % $1 = $2
				RETURNING id, created_at)
			INSERT INTO refund_events (refund_id, from_status, to_status, actor_kind, created_at)
			SELECT r.id, s.from_status, s.to_status, 'api', r.created_at
			FROM r, (VALUES (NULL, 'Pending'), ('Pending', 'Succeeded')) s (from_status, to_status)`, txs, k); err != nil {
			t.Fatal(err)
		}
	}
}

// The flagged refunds (the flagged page, refreshed on every refund change) are read through
// their partial index, never by walking every refund: 100 000 sessions, a refund of every fifth
// Completed one, three of them flagged and Pending (a million sessions in make polygon).
// Negative control (run by hand): without refunds_flagged, a Seq Scan of refunds.
func TestFlaggedRefundsReadByTheirIndex(t *testing.T) {
	t.Parallel()
	n := planScale()
	pool := testdb.New(t)
	ctx := context.Background()
	fillSessions(t, pool, n, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	fillRefunds(t, pool, 1)
	if _, err := pool.Exec(ctx, `UPDATE refunds SET status = 'Pending', flagged_at = created_at, flag_reason = 'fill'
		WHERE id IN (SELECT id FROM refunds ORDER BY id LIMIT 3)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE refunds`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var walk func(node map[string]any)
	used := false
	walk = func(node map[string]any) {
		if node["Node Type"] == "Seq Scan" {
			t.Errorf("Seq Scan of %v in the plan", node["Relation Name"])
		}
		used = used || node["Index Name"] == "refunds_flagged"
		for _, k := range planChildren(node) {
			walk(k)
		}
	}
	walk(explain(t, conn.Conn(), flaggedRefundsSQL(false), nil))
	walk(explain(t, conn.Conn(), flaggedRefundsSQL(true), []any{time.Now(), "00000000-0000-0000-0000-000000000000"}))
	walk(explain(t, conn.Conn(), flaggedRefundsCountSQL, nil))
	if !used {
		t.Error("refunds_flagged not used")
	}
}
