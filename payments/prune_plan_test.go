package payments

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/internal/testdb"
)

// TestPruneBatchesReadTheirRowsByKeyInAGenericPlan: a prune batch is a prepared statement, and
// from its sixth run on a connection PostgreSQL may plan it generically, not knowing the batch
// is small: the batch's rows joined to the table were a hash join over a sequential scan of the
// whole table, once per batch (an outside review: 8.2 million rows read to prune a 300,000-row
// inbox). Each batch statement's generic plan (real and dry), over tables of 20,000 old rows,
// reads the table it prunes by its primary key only: no sequential scan, and no other index of
// it (the call log's time index, a range over every old row, once per batch). Negative controls:
// the join (`USING batch WHERE t.id = batch.id`) reads the inbox and the outbox sequentially;
// the age tested on the table reads gateway_calls_created.
func TestPruneBatchesReadTheirRowsByKeyInAGenericPlan(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	old := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
	for _, sql := range []string{
		`INSERT INTO webhook_events (gateway, event_id, received_at, last_received_at, processed_at, outcome)
			SELECT 'fake', 'e-' || i, $1, $1, $1, 'applied' FROM generate_series(1, 20000) i`,
		`INSERT INTO outbox (kind, to_addr, body, created_at, delivered_at, attempts)
			SELECT 'code', 'a', 'x', $1, $1, 1 FROM generate_series(1, 20000) i`,
		`INSERT INTO gateway_calls (operation, outcome, latency_ms, created_at)
			SELECT 'find', 'ok', 1, $1 FROM generate_series(1, 20000) i`,
	} {
		if _, err := pool.Exec(ctx, sql, old); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE webhook_events, outbox, gateway_calls`); err != nil {
		t.Fatal(err)
	}
	genericPlans(t, pool, func(conn *pgx.Conn) {
		for _, pt := range pruneTables {
			for _, dry := range []bool{false, true} {
				plan := explain(t, conn, pruneBatchSQL(pt, dry), []any{int64(0), DefaultPruneBatch, old.Add(30 * 24 * time.Hour)})
				var walk func(node map[string]any)
				walk = func(node map[string]any) {
					index, _ := node["Index Name"].(string)
					switch {
					case node["Node Type"] == "Seq Scan" && node["Relation Name"] == pt.name:
						t.Errorf("%s's batch (dry %v): a sequential scan of the table in its generic plan", pt.name, dry)
					case strings.HasPrefix(index, pt.name+"_") && index != pt.name+"_pkey":
						t.Errorf("%s's batch (dry %v): reads the table through %s in its generic plan", pt.name, dry, index)
					}
					for _, k := range planChildren(node) {
						walk(k)
					}
				}
				walk(plan)
			}
		}
	})
}
