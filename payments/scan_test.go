package payments

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/internal/testdb"
)

// TestSessionScanPlansReadWhatPgxReads: a session row read through the cached scan plans
// (scanSession on pgx.Rows) is the session pgx's own Scan reads — with every nullable column
// set and with every one NULL — and a row in text format (a simple-protocol query, as through a
// pooler) does not fit the binary plans and is read by pgx.
func TestSessionScanPlansReadWhatPgxReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.NewURL(t))
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456000, time.UTC)
	for i, lease := range []bool{true, false} {
		var next, until, flagged any
		owner := any(nil)
		if lease {
			next, until, flagged, owner = at, at.Add(time.Minute), at.Add(2*time.Minute), "replica-a"
		}
		order := "scan-" + string(rune('a'+i))
		if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, $2, $2)`, order, at); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway,
			gateway_payment_id, next_check_at, lease_owner, lease_until, flagged_at, flag_reason, created_at, updated_at)
			VALUES (gen_random_uuid(), $1, 1234, 'EUR', 'Unknown', 'fake', $2, $3, $4, $5, $6, $7, $8, $8)`,
			order, nil, next, owner, until, flagged, nil, at); err != nil {
			t.Fatal(err)
		}
	}
	read := func(mode pgx.QueryExecMode) []Session {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT `+sessionColumns+` FROM payment_sessions ORDER BY order_id`, mode)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) { return scanSession(r) })
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// pgx's own reading: the row as pgx.Row alone (no raw values), so planCache.scan hands it
	// to row.Scan.
	var want []Session
	rows, err := pool.Query(ctx, `SELECT `+sessionColumns+` FROM payment_sessions ORDER BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		s, err := scanSession(struct{ pgx.Row }{rows})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, s)
	}
	if rows.Close(); rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(want) != 2 || want[0].NextCheckAt == nil || want[1].NextCheckAt != nil {
		t.Fatalf("setup: want one session with its nullable columns set and one without, got %+v", want)
	}

	got := read(pgx.QueryExecModeCacheStatement)
	p := sessionScans.plans.Load()
	if p == nil || len(p.plans) != 17 {
		t.Fatalf("the binary read left no plans for a session row: %+v", p)
	}
	if !reflect.DeepEqual(want, got) {
		t.Errorf("through the cached plans:\n got %+v\nwant %+v", got, want)
	}
	if text := read(pgx.QueryExecModeSimpleProtocol); !reflect.DeepEqual(want, text) {
		t.Errorf("a text-format row:\n got %+v\nwant %+v", text, want)
	}
}
