package payments_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"pitlane/payments"
)

// A patrol round lasts as long as sessions are due (a drain after an outage is one round), and
// RunSweeper ran the housekeeping and the minute's Operations sample only between rounds: for the
// whole drain no dead code in the outbox was redacted (promised within 5 minutes) and no minute
// was sampled (the backlog chart blank exactly while there is a backlog). They run on a loop of
// their own now. Here the drain of 12 due sessions takes 12 minutes of the service clock (width 1,
// each claim a minute after the one before); an undelivered code dies one minute in. At the
// eighth claim, with the round still draining, the upkeep loop's next passes must have redacted
// the code and sampled the minute. Outside review (retention); fails with the upkeep between
// rounds (the eighth claim's wait for an upkeep pass times out).
func TestADrainDoesNotHoldHousekeepingOrTheOpsSamples(t *testing.T) {
	t.Parallel()
	var claims atomic.Int32
	upkept := make(chan struct{}, 100)
	type seen struct {
		passes            int
		redacted, sampled bool
	}
	result := make(chan *seen, 1)
	var b *bench
	b = newBench(t, func(c *payments.Config) {
		c.SweepConcurrency = 1
		c.Hooks.AfterUpkeep = func(context.Context) { upkept <- struct{}{} }
		c.Hooks.AfterSweepClaim = func(ctx context.Context, ids []string) {
			k := claims.Add(1)
			if k > 8 {
				return
			}
			b.clock.Advance(time.Minute) // each drive of the drain takes a minute
			if k != 8 {
				return
			}
			s := &seen{}
			for len(upkept) > 0 { // passes that may have started before 12:08
				<-upkept
			}
			for s.passes < 2 { // the second pass from now started at 12:08 or later
				select {
				case <-upkept:
					s.passes++
				case <-time.After(10 * time.Second):
					result <- s
					return
				}
			}
			s.redacted = b.count(t, `SELECT count(*) FROM outbox WHERE body LIKE '%424242%'`) == 0
			s.sampled = b.count(t, `SELECT count(*) FROM ops_samples WHERE at > $1`, t0) > 0
			result <- s
		}
	})
	b.reconcileElsewhere(t)
	b.seedRegistered(t, 12)
	// A cancel code never delivered (no notifier: admins relay it from the outbox) that dies at
	// t0 + 1 min (CodeTTL after it was written; no challenge row: the message's age decides).
	b.exec(t, `INSERT INTO outbox (kind, to_addr, body, redacted_body, created_at)
		VALUES ('cancel_code', 'ana@example.com', 'your code is 424242', 'your code is ••••••', $1)`,
		t0.Add(-10*time.Minute+time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, 10*time.Millisecond); close(done) }()
	s := mustWait(t, result, "the eighth claim's look (within 10 s of upkeep)")
	cancel()
	mustWait(t, done, "the patrol to stop")
	if s.passes < 2 {
		t.Fatalf("no upkeep pass ran while the round drained (%d passes in 10 s)", s.passes)
	}
	if !s.redacted || !s.sampled {
		t.Fatalf("during the drain, at 12:08: the dead code redacted %v, a minute sampled %v", s.redacted, s.sampled)
	}
}

// The delta tables behind the exact counts (session_status_deltas, ledger_day_deltas) were
// folded only when read — the dashboard, /metrics, the ledger page — so with nothing reading
// them they grew without bound, and the first read summed them all. Housekeeping folds them.
// Outside review (retention); fails without the fold in housekeep.
func TestHousekeepingFoldsTheCountDeltas(t *testing.T) {
	t.Parallel()
	passed := make(chan struct{}, 100)
	b := newBench(t, func(c *payments.Config) {
		c.Hooks.AfterUpkeep = func(context.Context) { passed <- struct{}{} }
	})
	b.reconcileElsewhere(t)
	b.exec(t, `INSERT INTO session_status_deltas (status, delta) SELECT 'Registered', 0 FROM generate_series(1, 1500)`)
	b.exec(t, `INSERT INTO ledger_day_deltas (day, currency, received, refunded, entries)
		SELECT '2026-11-01', 'EUR', 0, 0, 0 FROM generate_series(1, 1500)`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, time.Hour); close(done) }()
	mustWait(t, passed, "the upkeep loop's first pass (housekeeping)")
	cancel()
	mustWait(t, done, "the patrol to stop")
	if n, m := b.count(t, `SELECT count(*) FROM session_status_deltas`), b.count(t, `SELECT count(*) FROM ledger_day_deltas`); n > 10 || m > 1 {
		t.Fatalf("after housekeeping: %d status delta rows, %d ledger day delta rows; want them folded (one per status, one per day and currency)", n, m)
	}
}

// The upkeep loop looks every SideLoopEvery whatever the patrol's interval: with
// SWEEP_INTERVAL at an hour (allowed), dead codes stayed in clear, the Operations page had one
// sample an hour and reconciliation ran hourly (an outside review). Here the interval is an
// hour, the side loops' look 10 ms: the upkeep passes follow one another.
func TestALongSweepIntervalDoesNotPaceTheUpkeep(t *testing.T) {
	t.Parallel()
	passed := make(chan struct{}, 100)
	b := newBench(t, func(c *payments.Config) {
		c.SideLoopEvery = 10 * time.Millisecond
		c.Hooks.AfterUpkeep = func(context.Context) { passed <- struct{}{} }
	})
	b.reconcileElsewhere(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, time.Hour); close(done) }()
	for range 3 {
		mustWait(t, passed, "an upkeep pass (the side loops look every 10 ms)")
	}
	cancel()
	mustWait(t, done, "the patrol to stop")
}

// An upkeep pass is bounded by a lease (TestAnUpkeepPassWaitsForASilentDatabaseNoLongerThanALease),
// never by less than 5 s: GATEWAY_TIMEOUT may be 10 ms and its lease 60 ms, and a housekeeping cut
// at 60 ms every pass would never redact a dead code. Fails with the lease alone.
func TestAnUpkeepPassHasAtLeastFiveSecondsWhateverTheLease(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	short := b.service(b.pool, "replica-short", func(c *payments.Config) { c.GatewayTimeout, c.LeaseDuration = 10*time.Millisecond, 0 })
	if got := short.UpkeepBound(); got != 5*time.Second {
		t.Fatalf("with a 10 ms gateway timeout an upkeep pass may take %s, want 5s", got)
	}
	long := b.service(b.pool, "replica-long", func(c *payments.Config) { c.GatewayTimeout, c.LeaseDuration = 10*time.Second, 0 })
	if got := long.UpkeepBound(); got != time.Minute {
		t.Fatalf("with a 10 s gateway timeout an upkeep pass may take %s, want its lease (1m0s)", got)
	}
}
