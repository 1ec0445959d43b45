package payments

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/internal/testdb"
)

// The payments list (GET /payments, the console's most visited page, and its live refresh)
// under a search and a status filter: the generic plan of each statement (what a prepared
// statement may switch to after five runs; issue 12's EXPLAIN under
// plan_cache_mode=force_generic_plan) reads by index. One statement for every filter,
// "($1 = ” OR …)", walked payment_sessions_created back filtering every row: a search for an
// order that is not there read every payment ever made (0.8–4 s at a million sessions; an
// outside review of plans at scale). Negative control: the one statement, 100 000 and 12 950
// rows read.
func TestPaymentListGenericPlansReadByIndex(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	fillSessions(t, pool, planScale(), time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	log := &testdb.StatementLog{}
	svc := NewService(testdb.Traced(t, pool, log), Config{})
	if _, err := svc.ListPayments(ctx, PaymentFilter{Query: "no-such-order"}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.ListPayments(ctx, PaymentFilter{Status: StatusCanceling}); err != nil {
		t.Fatal(err)
	}
	stmts := log.Take()
	if len(stmts) != 2 {
		t.Fatalf("recorded %d statements, want the list's one statement twice", len(stmts))
	}
	genericPlans(t, pool, func(conn *pgx.Conn) {
		for i, what := range []string{"a search that matches nothing", "Canceling payments"} {
			plan := explainWith(t, conn, "ANALYZE, FORMAT JSON", stmts[i].SQL, stmts[i].Args)
			eachScan(plan, func(rel string, node map[string]any, read float64) {
				// 2% of the sessions are active: a status filter may read them all, no more.
				if rel == "payment_sessions" && read > float64(planScale())/20 {
					t.Errorf("generic plan, %s: %s %v reads %.0f rows of payment_sessions", what, node["Node Type"], node["Index Name"], read)
				}
			})
		}
	})
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
