package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
)

// runPruneCmd runs `pitlane prune args…` in-process through Main against url.
func runPruneCmd(t *testing.T, url string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := map[string]string{"DATABASE_URL": url}
	e := &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string { return env[k] }, Logger: slog.New(slog.DiscardHandler)}
	code = Main(append([]string{"prune"}, args...), e)
	return code, out.String(), errOut.String()
}

// TestPruneCommand: with its defaults `pitlane prune` deletes the webhook events processed over
// 30 days ago and the messages delivered over 90 days ago, keeps the gateway call log whole and
// everything younger, prints a line per table and exits 0; --dry-run prints the same counts and
// the rules and deletes nothing; --gateway-calls 400d prunes the call log too. Bad ages exit 2
// with one line and touch nothing.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool := testdb.Pool(t, url)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	count := func(table string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	exec(`INSERT INTO webhook_events (gateway, event_id, received_at, last_received_at, processed_at, outcome) VALUES
		('refgw', 'e-old', now() - interval '40 days', now() - interval '40 days', now() - interval '40 days', 'applied'),
		('refgw', 'e-month', now() - interval '20 days', now() - interval '20 days', now() - interval '20 days', 'applied')`)
	exec(`INSERT INTO outbox (kind, to_addr, body, created_at, delivered_at, attempts) VALUES
		('code', 'old', 'x', now() - interval '100 days', now() - interval '100 days', 1),
		('code', 'month', 'x', now() - interval '40 days', now() - interval '40 days', 1)`)
	exec(`INSERT INTO gateway_calls (operation, outcome, latency_ms, created_at) VALUES
		('find', 'ok', 1, now() - interval '500 days'), ('find', 'ok', 1, now() - interval '100 days')`)

	for _, bad := range [][]string{{"--outbox", "90"}, {"--outbox", "1h"}, {"--gateway-calls", "-3d"}, {"--webhook-events", "soon"}, {"extra"},
		{"--outbox", "90d", "--webhook-events", "keep", "--outbox", "1d"}} { // given twice: which one? (an outside review)
		code, stdout, stderr := runPruneCmd(t, url, bad...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("prune %v: exit %d, stdout %q, stderr %q; want 2 and one line", bad, code, stdout, stderr)
		}
	}

	if code, stdout, _ := runPruneCmd(t, url, "--dry-run", "-h"); code != 0 || !strings.Contains(stdout, "usage: pitlane prune") {
		t.Errorf("prune --dry-run -h: exit %d, %q; want the usage and 0", code, stdout)
	}
	code, stdout, stderr := runPruneCmd(t, url, "--dry-run")
	if code != 0 {
		t.Fatalf("dry run: exit %d, %s", code, stderr)
	}
	for _, want := range []string{"prune webhook_events  would delete 1 rows from before ", "prune outbox          would delete 1 rows from before ",
		"prune gateway_calls   kept whole", "  outbox: messages delivered or skipped"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run's output lacks %q:\n%s", want, stdout)
		}
	}
	if count("webhook_events") != 2 || count("outbox") != 2 || count("gateway_calls") != 2 {
		t.Fatal("a dry run deleted rows")
	}

	if code, stdout, stderr = runPruneCmd(t, url); code != 0 {
		t.Fatalf("prune: exit %d, %s", code, stderr)
	}
	if !strings.Contains(stdout, "prune webhook_events  deleted 1 rows") || !strings.Contains(stdout, "prune outbox          deleted 1 rows") {
		t.Errorf("prune's output:\n%s", stdout)
	}
	if count("webhook_events") != 1 || count("outbox") != 1 || count("gateway_calls") != 2 {
		t.Fatalf("after prune: %d events, %d messages, %d calls; want 1, 1, 2", count("webhook_events"), count("outbox"), count("gateway_calls"))
	}
	var audits int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE action = 'retention.prune' AND actor LIKE 'cli%'`).Scan(&audits); err != nil || audits != 2 {
		t.Errorf("%d audit entries (%v), want 2", audits, err)
	}

	if code, stdout, stderr = runPruneCmd(t, url, "--gateway-calls", "400d", "--webhook-events", "keep", "--outbox", "keep"); code != 0 {
		t.Fatalf("prune --gateway-calls: exit %d, %s", code, stderr)
	}
	if !strings.Contains(stdout, "prune gateway_calls   deleted 1 rows") || count("gateway_calls") != 1 {
		t.Errorf("prune --gateway-calls 400d:\n%s(%d calls left, want 1)", stdout, count("gateway_calls"))
	}
}

// A table that stopped short says so, with what it did, and never reads as kept whole.
func TestPrintPruneSaysWhereATableStopped(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	before := time.Date(2025, 10, 26, 12, 0, 0, 0, time.UTC)
	printPrune(&out, []payments.PruneCount{
		{Table: "gateway_calls", Before: before, Deleted: 5000, Err: errors.New("prune gateway_calls: ERROR: canceling statement due to lock timeout")},
		{Table: "outbox", Before: before, Deleted: 3},
	}, false)
	want := "prune gateway_calls   stopped: deleted 5000 rows from before 2025-10-26T12:00:00Z, then: prune gateway_calls: ERROR: canceling statement due to lock timeout\n" +
		"prune outbox          deleted 3 rows from before 2025-10-26T12:00:00Z\n" +
		"prune webhook_events  kept whole\n"
	if out.String() != want {
		t.Fatalf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}
