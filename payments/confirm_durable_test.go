package payments_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/pgrunner"
	"pitlane/payments"
)

// confirmDurable is what a claim read back after its COMMIT's answer was lost waits for before
// it is sent on: a commit that must reach the synchronous standbys. On a cluster of its own whose
// one synchronous standby never answers, it must not come back acknowledged. Its first statement
// (an xid, pg_current_xact_id) wrote no WAL before its commit record, and PostgreSQL neither
// flushes nor waits for a standby then: it was acknowledged at once (a review; the negative
// control is that statement, run here too).
func TestConfirmDurableWaitsForTheSynchronousStandbys(t *testing.T) {
	t.Parallel()
	settings := maps.Clone(pgrunner.ThrowawaySettings)
	settings["synchronous_commit"] = "on"
	settings["synchronous_standby_names"] = "a_standby_that_never_answers"
	c, err := pgrunner.Start(context.Background(), pgrunner.Options{Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	pool, err := pgxpool.New(context.Background(), c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := payments.ConfirmDurable(ctx, pool); err == nil {
		t.Fatalf("%s was acknowledged with a synchronous standby that never answers", payments.ConfirmDurableSQL)
	}
	// The statement that was there before: acknowledged at once, the standby never asked.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	if _, err := pool.Exec(ctx2, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatalf("negative control: an xid alone waited for the standby (%v): this cluster proves nothing", err)
	}
}
