package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// TestCachedStatsOneCountForAllReplicas: two replicas scrape within the maximum age; the second
// gets the first one's counts (a session created in between is not counted yet: no second
// count ran), and once the counts are older than the maximum age the next scrape counts again.
// A scrape that finds another one counting does not wait for it: it gets the stored counts.
func TestCachedStatsOneCountForAllReplicas(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	a, other := b.svc, b.service(b.pool, "replica-b")
	const maxAge = 5 * time.Second
	actor := payments.Actor{Kind: payments.ActorAPI, ID: "t"}

	st, err := a.CachedStats(ctx, maxAge)
	if err != nil || st.Sessions[payments.StatusRegistered] != 0 {
		t.Fatalf("first scrape: %+v %v", st, err)
	}
	if _, err := b.plain.Create(ctx, actor, payments.CreateInput{OrderID: "stats-1", Amount: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(maxAge - time.Second)
	st, err = other.CachedStats(ctx, maxAge)
	if err != nil || st.Sessions[payments.StatusRegistered] != 0 {
		t.Fatalf("another replica within the maximum age: %v %v, want the stored count 0 (no second count)", st.Sessions, err)
	}
	if live, _ := other.Stats(ctx); live.Sessions[payments.StatusRegistered] != 1 {
		t.Fatalf("control: a direct count sees %d Registered, want 1", live.Sessions[payments.StatusRegistered])
	}

	b.clock.Advance(time.Second)
	st, err = other.CachedStats(ctx, maxAge)
	if err != nil || st.Sessions[payments.StatusRegistered] != 1 {
		t.Fatalf("after the maximum age: %v %v, want a new count (1)", st.Sessions, err)
	}

	// Someone is counting right now (holds the row): the stored counts, at once.
	if _, err := b.plain.Create(ctx, actor, payments.CreateInput{OrderID: "stats-2", Amount: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(maxAge)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT 1 FROM stats_cache WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	st, err = a.CachedStats(ctx, maxAge)
	if err != nil || st.Sessions[payments.StatusRegistered] != 1 {
		t.Fatalf("while another scrape counts: %v %v, want the stored count 1", st.Sessions, err)
	}
}

// TestCachedStatsCountsOnAPoolOfOneConnection: the /metrics scrape's count on a replica whose
// DATABASE_URL says pool_max_conns=1. CachedStats claimed the stats_cache row in a transaction
// and, while that transaction kept the pool's only connection, counted through the pool (Stats)
// on a second one: it waited for itself until the scrape's deadline, so every scrape of such a
// replica answered pitlane_stats_up 0 on a healthy database (PitlaneStatsUnavailable when every
// replica runs so), and for those seconds the replica's only connection sat idle in a
// transaction (an outside review: pgbouncer / small pools). The counts now go through the
// claim's transaction.
//
// Negative control: with CachedStats counting through s.Stats(ctx) again, the call fails with
// "context deadline exceeded" at the bound.
func TestCachedStatsCountsOnAPoolOfOneConnection(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	svc := b.service(testdb.PoolOf(t, b.pool, 1), "one-conn")
	if _, err := b.plain.Create(context.Background(), api, payments.CreateInput{OrderID: "stats-one", Amount: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	// Bounded: without the fix the count waits for ever for a second connection. (The scrape's
	// own deadline, web/metrics.go statsCollector.timeout, is 2 s: too short a bound for a
	// loaded CI machine on what must succeed.)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := svc.CachedStats(ctx, 5*time.Second)
	if err != nil {
		t.Fatalf("CachedStats on a pool of one connection: %v (the database is idle and healthy; "+
			"the claim's transaction holds the only connection while the count waits for another)", err)
	}
	if st.Sessions[payments.StatusRegistered] != 1 {
		t.Fatalf("counts %v, want 1 Registered", st.Sessions)
	}
	// And it stored them: another replica within the maximum age reads them instead of counting.
	if _, err := b.plain.Create(context.Background(), api, payments.CreateInput{OrderID: "stats-two", Amount: 100, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	if st, err := b.svc.CachedStats(context.Background(), 5*time.Second); err != nil || st.Sessions[payments.StatusRegistered] != 1 {
		t.Fatalf("another replica within the maximum age: %v %v, want the stored count 1", st.Sessions, err)
	}
}

// anotherGateway is a second gateway by name (GATEWAY differs between replicas: a rolling
// switch, or replicas kept on the old gateway to settle its sessions).
type anotherGateway struct{ *fakegw.Gateway }

func (anotherGateway) Name() string { return "other" }

// Each replica's /metrics tells its own gateway's webhook events not yet applied, cached or not:
// the cached counts were the gateway's of whichever replica counted last, so with GATEWAY
// differing between replicas each scrape served the other gateway's backlog every other count
// and alerts on it flapped (an outside review, numbers).
func TestCachedStatsTellEachReplicaItsOwnGatewaysEvents(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	other := b.service(b.pool, "replica-b", func(c *payments.Config) { c.Gateway = anotherGateway{b.gw} })
	const maxAge = 5 * time.Second
	b.exec(t, `INSERT INTO webhook_events (gateway, event_id, received_at, last_received_at)
		VALUES ('fake', 'e-f1', $1, $1), ('other', 'e-o1', $2, $2), ('other', 'e-o2', $2, $2), ('other', 'e-o3', $2, $2)`,
		t0.Add(-time.Hour), t0.Add(-2*time.Hour))
	st, err := other.CachedStats(ctx, maxAge) // replica-b's scrape counts
	if err != nil || st.UnprocessedEvents != 3 || st.OldestUnprocessedEvent != 2*time.Hour {
		t.Fatalf("replica-b (gateway other): %d events, the oldest %s, %v; want 3, 2h", st.UnprocessedEvents, st.OldestUnprocessedEvent, err)
	}
	b.clock.Advance(time.Second)
	st, err = b.svc.CachedStats(ctx, maxAge) // replica-a's a second later: the stored counts
	if err != nil || st.UnprocessedEvents != 1 || st.OldestUnprocessedEvent != time.Hour {
		t.Fatalf("replica-a (gateway fake) is served %d events, the oldest %s (%v); its gateway has 1, an hour old", st.UnprocessedEvents, st.OldestUnprocessedEvent, err)
	}
	if st, err := b.svc.Stats(ctx); err != nil || st.UnprocessedEvents != 1 {
		t.Fatalf("replica-a counting itself: %d %v, want 1", st.UnprocessedEvents, err)
	}
}

// A rolling deploy: a replica of the release before stores the cached counts without
// EventBacklogs (its own gateway's backlog in UnprocessedEvents and its age); a replica of this
// release reading them within the maximum age keeps that backlog. It reported none (ofGateway
// read a nil map), so pitlane_webhook_events_unprocessed fell to 0 on every count an old replica
// made (a review of TestCachedStatsTellEachReplicaItsOwnGatewaysEvents's change).
func TestCachedStatsOfTheReleaseBeforeKeepItsBacklog(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	const maxAge = 5 * time.Second
	b.exec(t, `INSERT INTO webhook_events (gateway, event_id, received_at, last_received_at)
		VALUES ('fake', 'e-f1', $1, $1), ('fake', 'e-f2', $1, $1)`, t0.Add(-time.Hour))
	if st, err := b.svc.CachedStats(ctx, maxAge); err != nil || st.UnprocessedEvents != 2 {
		t.Fatalf("count: %d %v", st.UnprocessedEvents, err)
	}
	// As the older version stored them: the same JSON without EventBacklogs.
	b.exec(t, `UPDATE stats_cache SET stats = stats - 'EventBacklogs' WHERE id = 1`)
	b.clock.Advance(time.Second)
	st, err := b.svc.CachedStats(ctx, maxAge)
	if err != nil || st.UnprocessedEvents != 2 || st.OldestUnprocessedEvent != time.Hour {
		t.Fatalf("a new replica served an older replica's counts: %d events, the oldest %s (%v); the gateway has 2, an hour old",
			st.UnprocessedEvents, st.OldestUnprocessedEvent, err)
	}
}
