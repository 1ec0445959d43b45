package live_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"pitlane/internal/testdb"
)

// The three hot tables (payment sessions, gateway calls, ledger entries) notify through their own
// trigger functions (migration 00430), which build the payload from the row's columns. Each
// payload must be exactly what the generic live_notify(kind, column) builds for the same row, so
// the listener and PostgreSQL's folding of identical payloads see no difference. The expected
// payload is computed here with live_notify's own expression over the row as jsonb.
func TestHotTablesNotifyWhatTheGenericTriggerWould(t *testing.T) {
	ctx := context.Background()
	url := testdb.NewURL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	writer := testdb.Pool(t, url)
	if _, err := conn.Exec(ctx, `LISTEN pitlane_live`); err != nil {
		t.Fatal(err)
	}
	// The hot tables' triggers are the direct ones (else this test compares live_notify with itself).
	var direct int
	if err := writer.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal
		AND tgfoid::regproc::text IN ('live_notify_session', 'live_notify_call', 'live_notify_ledger')`).Scan(&direct); err != nil || direct != 4 {
		t.Fatalf("%d triggers use the direct functions (%v), want 4", direct, err)
	}
	generic := func(kind, column, table, where string) string {
		t.Helper()
		var p string
		if err := writer.QueryRow(ctx, `SELECT json_strip_nulls(json_build_object(
				'k', $1::text, 'id', r ->> $2, 'o', r ->> 'order_id',
				's', CASE WHEN $1 = 'session' THEN r ->> 'status' END))::text
			FROM (SELECT to_jsonb(x) AS r FROM `+table+` x WHERE `+where+`) AS row`, kind, column).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	expect := func(step, want string) {
		t.Helper()
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Payload != want {
			t.Errorf("%s: payload %s, want %s", step, n.Payload, want)
		}
	}
	const id = "5a7e0000-0000-4000-8000-00000000a11e"
	steps := []struct{ name, sql, kind, column, table, where string }{
		{"session insert", `WITH o AS (INSERT INTO orders (order_id, created_at, updated_at) VALUES ('live:order.1', now(), now()))
			INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, next_check_at, created_at, updated_at)
			VALUES ('` + id + `', 'live:order.1', 100, 'EUR', 'Registering', 'fake', now(), now(), now())`,
			"session", "id", "payment_sessions", "id = '" + id + "'"},
		{"session update", `UPDATE payment_sessions SET status = 'Completed', next_check_at = NULL WHERE id = '` + id + `'`,
			"session", "id", "payment_sessions", "id = '" + id + "'"},
		{"gateway call", `INSERT INTO gateway_calls (session_id, operation, outcome, latency_ms, created_at)
			VALUES ('` + id + `', 'status', 'ok', 1, now())`, "call", "session_id", "gateway_calls", "session_id = '" + id + "'"},
		{"ledger entry", `INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, created_at)
			VALUES ('live:order.1', '` + id + `', 'PaymentReceived', 100, 'EUR', now())`,
			"ledger", "session_id", "accounting_entries", "session_id = '" + id + "'"},
	}
	for _, s := range steps {
		if _, err := writer.Exec(ctx, s.sql); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		expect(s.name, generic(s.kind, s.column, s.table, s.where))
	}
}
