package payments

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"pitlane/internal/testdb"
)

// The stats' failing messages and the admin outbox of one payment read the outbox through
// indexes (outbox_failing, outbox_payment: migration 00870), not all of it: without a
// NOTIFY_WEBHOOK_URL nothing is ever delivered and outbox_undelivered is the whole table; the
// outbox keeps every message. Before, both were sequential scans (an outside review: 1 s for
// the stats at 2,000,000 messages, every /metrics refresh).
func TestOutboxReadsByIndex(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	const payment = "0b8e6f3c-2a41-4d5e-9f70-1c2d3e4f5a6b"
	for _, sql := range []string{
		// Never tried (no notifier), of 2,000 payments; the payment's own is the oldest.
		`INSERT INTO outbox (kind, to_addr, body, order_id, payment_id, created_at)
		SELECT 'cancel_code', 'buyer@example.com', 'code ' || i, 'o-' || (i % 2000),
			CASE WHEN i = 1 THEN '` + payment + `'::uuid ELSE md5((i % 2000)::text)::uuid END, now() - make_interval(secs => 30000 - i)
		FROM generate_series(1, 30000) i`,
		`UPDATE outbox SET attempts = 1, last_error = 'refused' WHERE id % 1000 = 0`, // a few failing
		`VACUUM ANALYZE outbox`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	log := &testdb.StatementLog{}
	svc := NewService(testdb.Traced(t, pool, log), Config{})
	if _, err := svc.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	msgs, err := svc.Outbox(ctx, Staff{Email: "admin@example.com", Role: "admin"}, payment)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("the payment's outbox: %d messages, %v", len(msgs), err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	read := 0
	for _, st := range log.Take() {
		if !strings.Contains(st.SQL, "outbox") {
			continue
		}
		read++
		plan := explainWith(t, conn.Conn(), "ANALYZE, FORMAT JSON", st.SQL, st.Args)
		eachScan(plan, func(rel string, node map[string]any, read float64) {
			if rel == "outbox" && read > 200 {
				js, _ := json.MarshalIndent(plan, "", "  ")
				t.Errorf("%s reads %.0f rows of the outbox:\n%s\n%s", node["Node Type"], read, st.SQL, js)
			}
		})
	}
	if read < 2 {
		t.Fatalf("%d statements read the outbox, want the stats' and the page's", read)
	}
}

// The housekeeping's redaction of dead codes (every 5 minutes, every replica) reads an outbox of
// delivered messages by index, not every message it keeps: it read them all, the planner
// counting "body <> redacted_body" as nearly every row (the review of this session's outbox
// changes). Two passes, codes in clear and failing messages, each with a predicate the planner
// can count (delivered_at IS NULL). Checked by hand: the statement before read it sequentially.
func TestRedactDeadCodesReadsByIndex(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for _, sql := range []string{
		// Delivered codes (redacted), the day's messages, a few still in clear and a few failing.
		`INSERT INTO outbox (kind, to_addr, body, redacted_body, order_id, created_at, delivered_at)
		SELECT 'cancel_code', 'buyer@example.com', 'code ••••••', 'code ••••••', 'o-' || i, now() - make_interval(secs => 30000 - i), now()
		FROM generate_series(1, 30000) i`,
		`UPDATE outbox SET body = 'code 123456', delivered_at = NULL WHERE id % 1000 = 0`,
		`UPDATE outbox SET delivered_at = NULL, attempts = 1, last_error = 'refused' WHERE id % 1000 = 500`,
		`VACUUM ANALYZE outbox`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	log := &testdb.StatementLog{}
	svc := NewService(testdb.Traced(t, pool, log), Config{})
	if _, err := svc.RedactDeadCodes(ctx, svc.cfg.Clock.Now(), 1000); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	read := 0
	for _, st := range log.Take() {
		if !strings.Contains(st.SQL, "outbox") {
			continue
		}
		read++
		args := st.Args
		if len(args) > 0 {
			if _, ok := args[0].(pgx.QueryExecMode); ok {
				args = args[1:]
			}
		}
		plan := explainWith(t, conn.Conn(), "FORMAT JSON", st.SQL, args)
		eachScan(plan, func(rel string, node map[string]any, _ float64) {
			if rel == "outbox" && node["Node Type"] == "Seq Scan" {
				js, _ := json.MarshalIndent(plan, "", "  ")
				t.Errorf("RedactDeadCodes scans the outbox:\n%s\n%s", st.SQL, js)
			}
		})
	}
	if read == 0 {
		t.Fatal("RedactDeadCodes sent no statement reading the outbox")
	}
}
