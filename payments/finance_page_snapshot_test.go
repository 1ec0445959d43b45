package payments_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
)

// beforeQuery is a pgx tracer that runs hook (once) just before the first statement whose text
// contains match is sent: a moment between two statements of one service call.
type beforeQuery struct {
	match string
	once  sync.Once
	hook  func()
}

func (q *beforeQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, q.match) {
		q.once.Do(q.hook)
	}
	return ctx
}
func (q *beforeQuery) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestStuckPageTotalsDescribeItsRows: a workbench page (its rows and "Stuck per state and
// currency" over the whole filter) read while the patrol settles one of its payments. The rows
// and the totals were read by separate statements outside one snapshot, so one page listed three
// Registered EUR payments and counted two (and summed 2 400 where its rows showed 3 600; an
// outside review, numbers2). They are read in one snapshot (readPage): here every stuck payment
// fits on one page, so the totals' count is the number of rows.
func TestStuckPageTotalsDescribeItsRows(t *testing.T) {
	t.Parallel()
	b, list := newCheckNowBench(t) // three stuck Registered EUR payments of 12.00, captured at the gateway
	ctx := context.Background()
	// The patrol (another replica, another connection) settles the first one between the reads.
	svc := b.service(settlingBefore(t, b, "GROUP BY ps.status, ps.currency", list[0]), "replica-finance")

	page, err := svc.StuckSessions(ctx, payments.StuckFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if page.Next != "" {
		t.Fatalf("setup: more than one page")
	}
	var count int
	var amount int64
	for _, tot := range page.Totals {
		count += tot.Count
		amount += tot.Amount
	}
	var rowsAmount int64
	for _, s := range page.Sessions {
		rowsAmount += s.Amount
	}
	if count != len(page.Sessions) || amount != rowsAmount {
		t.Fatalf("one page lists %d stuck payments (%d minor units) and its totals count %d (%d minor units): rows %v, totals %+v",
			len(page.Sessions), rowsAmount, count, amount, ids(page.Sessions), page.Totals)
	}
}

// TestFlaggedPageCountDescribesItsRows: the same on /finance/flagged: its list and "the count of
// all" were two statements, so a page read while a Check settled a flagged payment listed three
// flagged payments under a count of two.
func TestFlaggedPageCountDescribesItsRows(t *testing.T) {
	t.Parallel()
	b, list := newCheckNowBench(t)
	ctx := context.Background()
	for _, id := range list {
		b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'schedule ran out' WHERE id = $1`, id, b.clock.Now())
	}
	page, err := b.service(settlingBefore(t, b, "SELECT count(*) FROM payment_sessions WHERE flagged_at IS NOT NULL", list[0]),
		"replica-finance").ListFlagged(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if page.Next == "" && int64(len(page.Sessions)) != page.Total {
		t.Fatalf("the flagged page lists %d payments under a count of %d", len(page.Sessions), page.Total)
	}
}

// settlingBefore is a pool on b's database that, just before its first statement containing
// match is sent, has a Check on another connection settle session id (the gateway captured it).
func settlingBefore(t *testing.T, b *bench, match, id string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.Tracer = &beforeQuery{match: match, hook: func() {
		if _, err := b.plain.Check(ctx, api, id); err != nil {
			t.Errorf("check: %v", err)
		}
	}}
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	return traced
}
