package payments

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
)

// The payment page (PaymentDetail: the console's most visited page, read again on every live
// refresh) reads each of its lists through an index on the payment: no statement it sends reads
// past more than a thousand rows of other payments, at 100 000 sessions (a million in make
// polygon) with their timelines, ledger entries, refunds, audit rows, closed cases and decided
// proposals, as a custom plan and as the generic plan a prepared statement may switch to.
// EXPLAIN ANALYZE of each recorded statement counts the rows every scan returned or filtered
// out. Negative control (run by hand): without accounting_entries_session (migration 00510) the
// ledger's read walks the whole ledger backwards by id, filtering out every other payment's
// entries.
func TestPaymentPageReadsByIndexes(t *testing.T) {
	t.Parallel()
	n := planScale()
	pool := testdb.New(t)
	ctx := context.Background()
	fillSessions(t, pool, n, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	fillRefunds(t, pool, 1)
	for _, sql := range []string{
		`INSERT INTO session_events (session_id, from_status, to_status, actor_kind, created_at)
		SELECT id, NULL, 'Registering', 'api', created_at FROM payment_sessions`,
		`INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, created_at)
		SELECT order_id, id, 'PaymentReceived', amount, currency, created_at FROM payment_sessions WHERE status = 'Completed'`,
		`INSERT INTO audit_log (at, actor, role, action, target, detail)
		SELECT created_at, 'sup@example.com', 'support', 'payment.check', id::text, 'fill'
		FROM (SELECT id, created_at, row_number() OVER (ORDER BY id) AS i FROM payment_sessions) p WHERE i % 10 = 0`,
		`INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at, resolved_at, resolved_by, resolution)
		SELECT id, order_id, 'late_payment', 'fill', created_at, created_at, 'fin@example.com', 'fill'
		FROM (SELECT id, order_id, created_at, row_number() OVER (ORDER BY id) AS i FROM payment_sessions) p WHERE i % 10 = 1`,
		`INSERT INTO resolution_proposals (session_id, order_id, outcome, status_at_proposal, reason, evidence, state,
			proposed_by, proposed_at, decided_by, decided_at)
		SELECT id, order_id, 'Failed', status, 'fill', 'fill', 'rejected', 'a@example.com', created_at, 'b@example.com', created_at
		FROM (SELECT id, order_id, status, created_at, row_number() OVER (ORDER BY id) AS i FROM payment_sessions) p WHERE i % 10 = 2`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("fill: %v\n%s", err, sql)
		}
	}
	for _, table := range []string{"session_events", "accounting_entries", "audit_log", "finance_cases", "resolution_proposals", "refunds", "refund_events"} {
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+table); err != nil {
			t.Fatal(err)
		}
	}
	// A Completed payment with a refund, a ledger entry and the rest: the fullest page.
	var id string
	if err := pool.QueryRow(ctx, `SELECT session_id::text FROM refunds ORDER BY id LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}

	log := &testdb.StatementLog{}
	traced := testdb.Traced(t, pool, log)
	d, err := NewService(traced, Config{}).PaymentDetail(ctx, id)
	if err != nil || len(d.Ledger) != 1 || len(d.Refunds) != 1 {
		t.Fatalf("PaymentDetail = %d ledger entries, %d refunds, %v", len(d.Ledger), len(d.Refunds), err)
	}
	stmts := log.Take()
	if len(stmts) < 8 {
		t.Fatalf("recorded %d statements", len(stmts))
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const most = 1000
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for _, st := range stmts {
			if w, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(st.SQL)), " "); w == "begin" || w == "commit" || w == "rollback" {
				continue // the order's read-only transaction (GetOrder): nothing to plan
			}
			plan := explainWith(t, conn.Conn(), "ANALYZE, FORMAT JSON", st.SQL, st.Args)
			eachScan(plan, func(rel string, node map[string]any, read float64) {
				if read > most {
					js, _ := json.MarshalIndent(plan, "", "  ")
					t.Errorf("%s: %s reads %.0f rows of %s for one payment:\n%s\n%s", mode, node["Node Type"], read, rel, st.SQL, js)
				}
			})
		}
	}
}
