package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
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
