package payments

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"pitlane/internal/testdb"
)

// The console's payment search reads through indexes whatever the database's collation: its
// order-id prefix (LIKE 'q%') is an index range on payment_sessions_order_pattern
// (text_pattern_ops, migration 00860). The tests' clusters are initdb --locale=C, where any
// btree index serves a prefix; here order_id gets an ICU en-US collation, as a database created
// with Debian's or a cloud's default locale gives it, and a search that matches nothing must
// not read the table. Before, it was a sequential scan of every payment ever made (an outside
// review: 26 ms at 100 000 sessions, linear in the table's age).
func TestPaymentSearchReadsByIndexUnderAnyCollation(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	fillSessions(t, pool, 20_000, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	for _, sql := range []string{
		`CREATE COLLATION en_search (provider = icu, locale = 'en-US')`,
		`ALTER TABLE payment_sessions ALTER COLUMN order_id TYPE text COLLATE en_search`,
		`VACUUM ANALYZE payment_sessions`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	log := &testdb.StatementLog{}
	page, err := NewService(testdb.Traced(t, pool, log), Config{}).ListPayments(ctx, PaymentFilter{Query: "no-such-order"})
	if err != nil || len(page.Sessions) != 0 {
		t.Fatalf("search: %d sessions, %v", len(page.Sessions), err)
	}
	stmts := log.Take()
	if len(stmts) != 1 {
		t.Fatalf("recorded %d statements, want the search's one", len(stmts))
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	plan := explainWith(t, conn.Conn(), "ANALYZE, FORMAT JSON", stmts[0].SQL, stmts[0].Args)
	eachScan(plan, func(rel string, node map[string]any, read float64) {
		if read > 100 {
			js, _ := json.MarshalIndent(plan, "", "  ")
			t.Errorf("%s reads %.0f rows of %s for a search that matches nothing:\n%s", node["Node Type"], read, rel, js)
		}
	})
}
