package main

// docs/operations.md, "A rolling deploy and its migrations", step 1, tells an operator whose
// `pitlane migrate` was killed during a CREATE INDEX CONCURRENTLY to cancel the build still
// running in its backend with a query. This test leaves migration 00420's build (a unique index
// of the busiest table) running in the backend `pitlane migrate` opened, as a killed migrate
// leaves it, and runs the runbook's selection, copied from the document, against
// pg_stat_activity. An outside review: the runbook's `query LIKE 'CREATE INDEX CONCURRENTLY%'`
// selected nothing (CREATE UNIQUE INDEX …), and the deploy stayed stuck.

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
)

func TestRunbookCancelQueryFindsAnInterruptedIndexBuild(t *testing.T) {
	// The runbook's query, as the operator copies it from the document.
	doc, err := os.ReadFile(runbooksPath)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`(SELECT pg_cancel_backend\\(pid\\) FROM pg_stat_activity WHERE [^`]+)`").
		FindSubmatch([]byte(strings.Join(strings.Fields(string(doc)), " ")))
	if m == nil {
		t.Fatal("the runbook's cancel query is not in docs/operations.md")
	}
	where := string(m[1])[strings.Index(string(m[1]), "WHERE ")+len("WHERE "):]
	t.Logf("runbook selects: %s", where)

	url := testdb.NewURL(t)
	pool := testdb.Pool(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The database as it was before 00420 (its two old indexes, 00420 not applied).
	for _, q := range []string{
		`DROP INDEX payment_sessions_gateway_payment_key`,
		`CREATE UNIQUE INDEX payment_sessions_gateway_payment_id ON payment_sessions (gateway, gateway_payment_id) WHERE gateway_payment_id IS NOT NULL`,
		`CREATE INDEX payment_sessions_gateway_payment ON payment_sessions (gateway_payment_id) WHERE gateway_payment_id IS NOT NULL`,
		`DELETE FROM goose_db_version WHERE version_id = 420`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// A writer's open transaction on the table: the concurrent build waits for it, as it waits
	// for a backup's snapshot or a long request in production.
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `LOCK TABLE payment_sessions IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := migrate(ctx, url); done <- err }()
	defer func() {
		_ = blocker.Rollback(context.Background())
		if err := <-done; err != nil {
			t.Logf("migrate: %v", err)
		}
	}()

	// Wait for `pitlane migrate`'s backend to be in the build, waiting for the writer (what a
	// killed migrate leaves running).
	var holder int
	if err := blocker.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	var building string
	for building == "" {
		if ctx.Err() != nil {
			t.Fatal("the build never waited for the writer")
		}
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(query), '') FROM pg_stat_activity WHERE datname = current_database()
			AND $1::int = ANY(pg_blocking_pids(pid))`, holder).Scan(&building); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("running in pitlane migrate's backend: %q", strings.SplitN(building, "\n", 2)[0])

	var found int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND (`+where+`)`).Scan(&found); err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Errorf("the runbook's query (%s) selects no backend while migration 00420's build runs: the operator cancels nothing, and the next `pitlane migrate` meets the build still running", where)
	}
}
