package payments

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/internal/testdb"
)

// The ledger page (GET /finance/ledger) reads at most its page's rows of the ledger whatever the
// filter: a range ending long ago, a currency with no entries, the rare RefundIssued. Ordered by
// id, the plan walked accounting_entries_pkey back from the newest entry filtering out everything
// after the range or of other currencies, or read the whole ledger (1.25 s and 382 ms at a
// million sessions, an outside review of plans at scale). Negative control: with the page ordered
// by id and without migration 00930's indexes, 16 000 to 33 000 rows here.
func TestLedgerPageReadsByIndexWhateverItsFilter(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	fillSessions(t, pool, planScale(), time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	// An entry per Completed session, written in the order of time (ids grow with created_at, as
	// they do in a live system); no refund (the rarest type there is).
	for _, sql := range []string{
		`INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, created_at)
		SELECT order_id, id, 'PaymentReceived', amount, currency, created_at FROM payment_sessions
		WHERE status = 'Completed' ORDER BY created_at, id`,
		`VACUUM ANALYZE accounting_entries`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("fill: %v\n%s", err, sql)
		}
	}
	var oldest time.Time
	if err := pool.QueryRow(ctx, `SELECT min(created_at) FROM accounting_entries`).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	day := oldest.UTC().Truncate(24 * time.Hour)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for name, f := range map[string]LedgerFilter{
		"the oldest day, EUR":     {From: day, To: day.Add(24 * time.Hour), Currency: "EUR"},
		"up to the oldest day":    {To: day.Add(24 * time.Hour), Currency: "EUR"},
		"a currency with nothing": {Currency: "CHF"},
		"refunds":                 {Type: "RefundIssued"},
	} {
		log := &testdb.StatementLog{}
		entries, err := NewService(testdb.Traced(t, pool, log), Config{}).LedgerEntries(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(entries); i++ {
			if a, b := entries[i-1], entries[i]; a.CreatedAt.Before(b.CreatedAt) {
				t.Fatalf("%s: entry %d (%s) before entry %d (%s): want the newest first", name, a.ID, a.CreatedAt, b.ID, b.CreatedAt)
			}
		}
		for _, st := range log.Take() {
			// Planned with its values every time: one cached statement served both entry types,
			// and its generic plan (after five pages of PaymentReceived) walked the whole ledger
			// for RefundIssued (the session's own review).
			if len(st.Args) == 0 || st.Args[0] != pgx.QueryExecModeExec {
				t.Errorf("%s: the page's statement is a cached one (args %v): want pgx.QueryExecModeExec", name, st.Args)
			}
			plan := explainWith(t, conn.Conn(), "ANALYZE, FORMAT JSON", st.SQL, st.Args)
			eachScan(plan, func(rel string, node map[string]any, read float64) {
				// A page may read its currency's share of a range's entries (the planner may
				// prefer the date's index when the currency is common: a fourth here); never the
				// ledger behind the range.
				if rel == "accounting_entries" && read > 5000 {
					t.Errorf("%s: %s %v reads %.0f rows of the ledger for a page of at most 500", name, node["Node Type"], node["Index Name"], read)
				}
			})
		}
	}
}
