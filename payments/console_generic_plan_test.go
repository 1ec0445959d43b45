package payments

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/internal/testdb"
)

// The payments list (GET /payments, the console's most visited page, and its live refresh)
// under a status filter: the generic plan of its statement (what a prepared statement may switch
// to after five runs; issue 12's EXPLAIN under plan_cache_mode=force_generic_plan) reads by
// index. One statement for every filter, "($1 = ” OR …)", walked payment_sessions_created back
// filtering every row: a search for an order that is not there read every payment ever made
// (0.8–4 s at a million sessions; an outside review of plans at scale). Negative control: the
// one statement, 100 000 and 12 950 rows read.
//
// A search is planned with its values every time (pgx.QueryExecModeExec): under the generic plan
// a prefix many orders share (the shop's own "ORD-2026"; "o-" and "o-1" here) read every matching
// row of the search's three conditions and sorted them for a page of 50 (100 000 and 11 112 rows;
// an outside review, console lists). Negative control: without the exec mode, the statement is a
// cached one.
func TestPaymentListGenericPlansReadByIndex(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	fillSessions(t, pool, planScale(), time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	log := &testdb.StatementLog{}
	svc := NewService(testdb.Traced(t, pool, log), Config{})
	if _, err := svc.ListPayments(ctx, PaymentFilter{Status: StatusCanceling}); err != nil {
		t.Fatal(err)
	}
	searches := []string{"no-such-order", "o-", "o-1"}
	for _, q := range searches {
		if _, err := svc.ListPayments(ctx, PaymentFilter{Query: q}); err != nil {
			t.Fatal(err)
		}
	}
	stmts := log.Take()
	if len(stmts) != 1+len(searches) {
		t.Fatalf("recorded %d statements, want one per list", len(stmts))
	}
	genericPlans(t, pool, func(conn *pgx.Conn) {
		plan := explainWith(t, conn, "ANALYZE, FORMAT JSON", stmts[0].SQL, stmts[0].Args)
		eachScan(plan, func(rel string, node map[string]any, read float64) {
			// 2% of the sessions are active: a status filter may read them all, no more.
			if rel == "payment_sessions" && read > float64(planScale())/20 {
				t.Errorf("generic plan, Canceling payments: %s %v reads %.0f rows of payment_sessions", node["Node Type"], node["Index Name"], read)
			}
		})
	})
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for i, q := range searches {
		st := stmts[1+i]
		if len(st.Args) == 0 || st.Args[0] != pgx.QueryExecModeExec {
			t.Errorf("search %q: the statement is a cached one (args %v): want pgx.QueryExecModeExec", q, st.Args)
			continue
		}
		plan := explainWith(t, conn.Conn(), "ANALYZE, FORMAT JSON", st.SQL, st.Args[1:])
		eachScan(plan, func(rel string, node map[string]any, read float64) {
			if rel == "payment_sessions" && read > 5000 {
				t.Errorf("search %q: %s %v reads %.0f rows of payment_sessions for a page of 50", q, node["Node Type"], node["Index Name"], read)
			}
		})
	}
}

// The audit log page filtered by a staff member (GET /admin/audit?actor=E) is planned with its
// values every time, and that plan reads by the actor's index: the generic plan a prepared
// statement switches to walks audit_log_pkey back filtering on actor — the cheapest guess for an
// actor of average share — and an actor with one entry read the whole log (997 ms at 500 000
// rows; the same review). Negative control: without pgx.QueryExecModeExec, the statement is a
// cached one (and its generic plan reads 200 001 rows here).
func TestAuditLogByActorIsPlannedWithItsValues(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO audit_log (at, actor, role, action, target, detail)
		SELECT now() - interval '1 second' * (200000 - i), 'staff' || (i % 40) || '@example.com', 'support', 'payment.check', 'p-' || i, 'fill'
		FROM generate_series(1, 200000) i`,
		`INSERT INTO audit_log (at, actor, role, action, target, detail) VALUES (now() - interval '300000 seconds', 'new@example.com', 'admin', 'login', 'new@example.com', '')`,
		`VACUUM ANALYZE audit_log`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("fill: %v\n%s", err, sql)
		}
	}
	log := &testdb.StatementLog{}
	if _, err := NewService(testdb.Traced(t, pool, log), Config{}).AuditLog(ctx, AuditFilter{Actor: "new@example.com"}); err != nil {
		t.Fatal(err)
	}
	stmts := log.Take()
	if len(stmts) != 1 || len(stmts[0].Args) == 0 || stmts[0].Args[0] != pgx.QueryExecModeExec {
		t.Fatalf("the page's statement %+v: want one, sent as an unnamed statement (pgx.QueryExecModeExec)", stmts)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	plan := explainWith(t, conn.Conn(), "ANALYZE, FORMAT JSON", stmts[0].SQL, stmts[0].Args[1:])
	eachScan(plan, func(rel string, node map[string]any, read float64) {
		if rel == "audit_log" && read > 1000 {
			t.Errorf("an actor with one entry: %s %v reads %.0f rows of audit_log", node["Node Type"], node["Index Name"], read)
		}
	})
}
