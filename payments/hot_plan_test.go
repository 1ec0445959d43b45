package payments

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
)

// TestHotStatementsKeepTheirGenericPlan: the statements that run once per Create or per patrol
// claim find active sessions through the partial indexes over them in a prepared statement's
// generic plan, and PostgreSQL does use that generic plan. pgx prepares every statement; when the
// generic plan is poor (status = ANY($1) hides the predicate of a partial index, so the generic
// plan reads the order index and filters, or scans the table), PostgreSQL plans the statement
// again at every execution: 0.3–0.5 ms each, measured in make bench's API figure. Written with
// status = ANY($n), the first half fails for both statements (the order index, a sequential
// scan) and the second for the claim (20 custom plans in 20 executions); whether the order read
// keeps its poorer generic plan depends on the costs PostgreSQL saw in its first five custom
// plans (in the API figure it did not: 4,280 plans in 5,094 executions).
func TestHotStatementsKeepTheirGenericPlan(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fillSessions(t, pool, 20_000, now)
	due := now.Add(time.Minute) // fillSessions makes every session due 5 s after now
	statements := []struct {
		name, sql, index string
		args             []any
	}{
		{"active session of an order", activeSessionOfOrderSQL, "payment_sessions_one_active_per_order", []any{"o-50"}},
		{"the hot order's lock-free read", activeOrOpenClaimSQL, "payment_sessions_one_active_per_order", []any{"o-50", int32(LockCreateOrder)}},
		{"patrol claim", claimDueSQL, "payment_sessions_due", []any{due, 16, "r1", due.Add(time.Minute), "fake"}},
	}
	genericPlans(t, pool, func(conn *pgx.Conn) {
		for _, st := range statements {
			checkPlan(t, "generic plan of "+st.name, explain(t, conn, st.sql, st.args), st.index)
		}
	})

	// Left to choose (plan_cache_mode auto, the default), PostgreSQL tries five custom plans and
	// then keeps the generic one when it is no worse: executions after the fifth are not planned.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, st := range statements {
		if _, err := conn.Conn().Prepare(ctx, "hot", st.sql); err != nil {
			t.Fatal(err)
		}
		for range 20 {
			tx, err := conn.Begin(ctx) // the claim writes: each execution is rolled back
			if err != nil {
				t.Fatal(err)
			}
			rows, err := tx.Query(ctx, "hot", st.args...)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				n++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatalf("%s: no row (the fixture should give it some)", st.name)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var generic, custom int64
		if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'hot'`).Scan(&generic, &custom); err != nil {
			t.Fatal(err)
		}
		if custom > 5 || generic < 15 {
			t.Errorf("%s: %d custom plans and %d generic ones in 20 executions; want the generic plan kept after the first five",
				st.name, custom, generic)
		}
		if err := conn.Conn().Deallocate(ctx, "hot"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPatrolClaimKeepsItsGenericPlan: the patrol's claim, as claimDue sends it, is not planned
// again at every claim. Left to itself PostgreSQL tries custom plans first and, when they look
// cheaper (they know LIMIT's value; the generic plan guesses a tenth of the table), keeps planning
// every time: 1,747 plans in 1,744 claims in make bench's sweeper figure. Without claimDue's
// SET LOCAL plan_cache_mode this test sees at least the first five claims planned. The generic
// plan must be a good one: with the due sessions in a CTE joined to the table, it was a hash join
// over a sequential scan of payment_sessions (2.5 ms a claim in the bench instead of 0.9).
func TestPatrolClaimKeepsItsGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // every claim and the look at the prepared statements share one connection
	// Prepared statements are what this is about: pgx's default mode, whatever the suite runs in
	// (make test also runs it in exec mode, pgbouncer's, where nothing is prepared).
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `
		WITH o AS (INSERT INTO orders (order_id, created_at, updated_at)
			SELECT 'due-' || i, now(), now() FROM generate_series(1, 2000) i)
		INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, next_check_at, created_at, updated_at)
		SELECT gen_random_uuid(), 'due-' || i, 100, 'EUR', 'Unknown', 'fake', now() - interval '1 hour' + i * interval '1 ms', now(), now()
		FROM generate_series(1, 2000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE payment_sessions`); err != nil {
		t.Fatal(err)
	}
	genericPlans(t, pool, func(conn *pgx.Conn) {
		due := time.Now()
		checkPlan(t, "generic plan of the claim", explain(t, conn, claimDueSQL, []any{due, 16, "claimer", due.Add(time.Minute), "fake"}), "payment_sessions_due")
	})

	svc := NewService(pool, Config{ReplicaID: "claimer"})
	for range 10 {
		claimed, err := svc.claimDue(ctx, 16)
		if err != nil || len(claimed) != 16 {
			t.Fatalf("claimed %d, %v; want 16", len(claimed), err)
		}
	}
	var generic, custom int64
	if err := pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
		claimDueSQL).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if custom != 0 || generic != 10 {
		t.Errorf("ten claims: %d custom plans, %d generic ones; want the generic plan every time", custom, generic)
	}
}

// genericPlans runs fn on a connection of pool on which PostgreSQL plans every prepared statement
// generically (what it does after five executions when it judges the generic plan no worse).
func genericPlans(t *testing.T, pool *pgxpool.Pool, fn func(conn *pgx.Conn)) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release() // before the pool closes, also when fn fails the test
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "RESET plan_cache_mode") //nolint:errcheck
	fn(conn.Conn())
}
