package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
)

// Housekeeping runs its steps one after another under one bound. The idempotency-key reaper's
// DELETE was an autocommit statement with no lock_timeout: while idempotency_keys was locked
// against writes (a REINDEX TABLE or a non-concurrent CREATE INDEX of that 30-day table, both
// SHARE locks) it waited out the whole bound, and every later step ran on an ended context; the
// pass, cut, ran again at the next one and waited again — for as long as the lock lasted no dead
// one-time code was redacted (promised within HousekeepingEvery) and nothing else was reaped
// (an outside review, patrol). Now the redaction goes first, and each reaper batch waits for a
// lock at most LockTimeout (execBounded). Negative controls: the reaper's batches as autocommit
// statements (exec: the old checkout intent, reaped after it, still there), and the old order
// (both: the code stays in clear).
func TestALockedReaperTableHoldsNoOtherHousekeeping(t *testing.T) {
	t.Parallel()
	// exec, the mode behind pgbouncer (docs/operations.md), sends the reaper's DELETE behind
	// its SET LOCAL lock_timeout; the default mode prepares a statement first, and PostgreSQL
	// takes a table's lock while it parses a DELETE: that first wait on a connection has no
	// bound but the upkeep's (the redaction, first, is done by then).
	for _, mode := range []struct {
		name        string
		exec, reaps bool
	}{{"cache_statement", false, false}, {"exec", true, true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			lockedReaperTable(t, mode.exec, mode.reaps)
		})
	}
}

func lockedReaperTable(t *testing.T, exec, reaps bool) {
	passed := make(chan struct{}, 100)
	mod := func(c *payments.Config) {
		c.GatewayTimeout, c.LeaseDuration = 100*time.Millisecond, 0 // upkeep bound: its 5 s floor
		c.LockTimeout = 200 * time.Millisecond
		c.SideLoopEvery = 10 * time.Millisecond
		c.Hooks.AfterUpkeep = func(context.Context) { passed <- struct{}{} }
	}
	b := newBench(t)
	svc := b.service(b.pool, "replica-a", mod)
	if exec {
		svc = b.service(testdb.Pool(t, b.url+"&default_query_exec_mode=exec"), "replica-a", mod)
	}
	b.reconcileElsewhere(t)
	// A cancel code never delivered (no notifier), dead since t0 + 1 min (no challenge row: the
	// message's age against CodeTTL decides), and a checkout intent (a Pay click) 31 days old,
	// whose reaper runs after the idempotency keys'.
	b.exec(t, `INSERT INTO outbox (kind, to_addr, body, redacted_body, created_at)
		VALUES ('cancel_code', 'ana@example.com', 'your code is 424242', 'your code is ••••••', $1)`,
		t0.Add(-10*time.Minute+time.Minute))
	b.exec(t, `INSERT INTO checkout_intents (key, order_id, amount, currency, created_at) VALUES ('4b1d7d1e-0000-4000-8000-000000000001', 'o-old-click', 100, 'EUR', $1)`,
		t0.Add(-payments.CheckoutIntentRetention-24*time.Hour))
	b.clock.Advance(2 * time.Minute)

	holder, _ := beginHolder(t, b.pool)
	if _, err := holder.Exec(context.Background(), `LOCK TABLE idempotency_keys IN SHARE MODE`); err != nil { // as REINDEX TABLE takes it
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.RunSweeper(ctx, time.Hour); close(done) }()
	mustWait(t, passed, "an upkeep pass")
	clear := b.count(t, `SELECT count(*) FROM outbox WHERE body LIKE '%424242%'`)
	gone := b.count(t, `SELECT count(*) FROM checkout_intents WHERE order_id = 'o-old-click'`)
	cancel()
	_ = holder.Rollback(context.Background())
	mustWait(t, done, "the patrol to stop")
	if clear != 0 {
		t.Fatalf("after a housekeeping pass with idempotency_keys locked, %d dead code(s) in clear in the outbox", clear)
	}
	if reaps && gone != 0 {
		t.Fatalf("after a housekeeping pass with idempotency_keys locked, a checkout intent 31 days old is still there: " +
			"the reaper's wait for the lock held every step after it")
	}
}
