package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"pitlane/internal/testdb"
	"pitlane/migrations"
)

// TestMigrateOnAReadOnlyDatabaseEnds: `pitlane migrate` of a new release against a database that
// refuses writes (a hot standby or reader endpoint named by mistake, a failover caught mid-way,
// default_transaction_read_only) ends with the database's own words. goose's lock retried the
// refused INSERT into goose_lock every 5 s for ever, printing nothing: the deploy's first step
// hung (an outside review). The minute is a bound on the hang, not a wait for an event.
func TestMigrateOnAReadOnlyDatabaseEnds(t *testing.T) {
	t.Parallel()
	url := testdb.NewEmptyURL(t)
	{ // a release before: this binary has migrations to apply, and goose_lock exists
		db := stdlib.OpenDBFromPool(testdb.Pool(t, url))
		p, err := migrations.NewProvider(db)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.UpTo(context.Background(), 630); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := migrate(ctx, url+sep+"default_transaction_read_only=on")
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("migrate on a read-only database with pending migrations: applied %d, %v; want it to end naming the read-only transaction", n, err)
	}
}
