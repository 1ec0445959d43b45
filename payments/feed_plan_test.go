package payments

import (
	"context"
	"os"
	"testing"
	"time"

	"pitlane/internal/testdb"
)

// The feed reads session_events through its own index from the cursor on, and payment_sessions
// by primary key: no sequential scan and no sort, as a custom plan and as the generic plan a
// prepared statement may switch to. make test fills 100 000 sessions with two events each,
// written by 40 transactions; make polygon (PITLANE_SCALE=full) a million.
func TestFeedReadsByItsIndex(t *testing.T) {
	t.Parallel()
	n := 100_000
	if os.Getenv("PITLANE_SCALE") == "full" {
		n = 1_000_000
	}
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
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE session_events`); err != nil {
		t.Fatal(err)
	}
	var midXid string
	var midID int64
	if err := pool.QueryRow(ctx, `SELECT xid::text, id FROM session_events ORDER BY xid, id OFFSET $1 LIMIT 1`, n).Scan(&midXid, &midID); err != nil {
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
		for name, args := range map[string][]any{
			"from the start":  {"0", int64(0), MaxFeedRead + 1},
			"from the middle": {midXid, midID, DefaultFeedRead + 1},
		} {
			var walk func(node map[string]any)
			var feedIndex bool
			walk = func(node map[string]any) {
				switch node["Node Type"] {
				case "Seq Scan", "Sort", "Incremental Sort":
					t.Errorf("%s, %s: %s of %v in the plan", mode, name, node["Node Type"], node["Relation Name"])
				}
				if node["Index Name"] == "session_events_feed" {
					feedIndex = true
				}
				if kids, ok := node["Plans"].([]any); ok {
					for _, k := range kids {
						walk(k.(map[string]any))
					}
				}
			}
			walk(explain(t, conn.Conn(), feedSQL, args))
			if !feedIndex {
				t.Errorf("%s, %s: session_events_feed not used", mode, name)
			}
		}
	}
}
