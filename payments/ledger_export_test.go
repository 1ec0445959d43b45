package payments_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
)

// ledgerDay books a completed payment of amount in currency on day d (t0 + d days), and a
// refund of refund when it is > 0.
func (b *bench) ledgerDay(t *testing.T, d int, order string, amount int64, currency string, refund int64) {
	t.Helper()
	ctx := context.Background()
	b.clock.Set(t0.Add(time.Duration(d) * 24 * time.Hour))
	s := b.createIn(t, order, amount, currency)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if s, err := b.plain.Check(ctx, api, s.ID); err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("complete %s: %s %v", order, s.Status, err)
	}
	if refund > 0 {
		if _, err := b.plain.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: refund, RequestKey: order + "-refund"}); err != nil {
			t.Fatalf("refund %s: %v", order, err)
		}
	}
}

// fourLedgerDays books four payments (orders prefix1…prefix4) over days 0, 1 and 3, in EUR and
// USD, two of them partly or wholly refunded.
func (b *bench) fourLedgerDays(t *testing.T, prefix string) {
	t.Helper()
	b.ledgerDay(t, 0, prefix+"1", 1000, "EUR", 0)
	b.ledgerDay(t, 1, prefix+"2", 2500, "EUR", 500)
	b.ledgerDay(t, 1, prefix+"3", 700, "USD", 0)
	b.ledgerDay(t, 3, prefix+"4", 900, "EUR", 900)
}

// The export streams every entry under the filter, oldest first, with the refund it books; the
// trial balance sums received − refunded per currency over the same dates and currency.
func TestLedgerExportAndTrialBalance(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.fourLedgerDays(t, "o-l")

	export := func(f payments.LedgerFilter) []string {
		t.Helper()
		var got []string
		n, err := b.svc.ExportLedger(ctx, f, func(e payments.ExportedEntry) error {
			s := e.OrderID + ":" + e.Type
			if e.RefundID != "" {
				s += ":refund"
			}
			got = append(got, s)
			return nil
		})
		if err != nil || n != len(got) {
			t.Fatalf("export %+v: %d %v", f, n, err)
		}
		return got
	}
	all := []string{"o-l1:PaymentReceived", "o-l2:PaymentReceived", "o-l2:RefundIssued:refund", "o-l3:PaymentReceived",
		"o-l4:PaymentReceived", "o-l4:RefundIssued:refund"}
	if got := export(payments.LedgerFilter{}); !slices.Equal(got, all) {
		t.Fatalf("export all = %v", got)
	}
	day1 := payments.LedgerFilter{From: t0.Add(24 * time.Hour), To: t0.Add(48 * time.Hour)}
	if got := export(day1); !slices.Equal(got, all[1:4]) {
		t.Fatalf("export day 1 = %v", got)
	}
	if got := export(payments.LedgerFilter{Currency: "eur", Type: payments.EntryRefundIssued}); !slices.Equal(got, []string{all[2], all[5]}) {
		t.Fatalf("export EUR refunds = %v", got)
	}

	tb, err := b.svc.TrialBalance(ctx, payments.LedgerFilter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []payments.LedgerTotal{{Currency: "EUR", Received: 4400, Refunded: 1400, Entries: 5}, {Currency: "USD", Received: 700, Entries: 1}}
	if !slices.Equal(tb, want) || tb[0].Net() != 3000 {
		t.Fatalf("trial balance = %+v, want %+v", tb, want)
	}
	// The entry-type filter does not halve a trial balance: both sides always count.
	tb, err = b.svc.TrialBalance(ctx, payments.LedgerFilter{From: day1.From, To: day1.To, Currency: "EUR", Type: payments.EntryPaymentReceived})
	if err != nil || !slices.Equal(tb, []payments.LedgerTotal{{Currency: "EUR", Received: 2500, Refunded: 500, Entries: 2}}) {
		t.Fatalf("trial balance of EUR on day 1 = %+v %v", tb, err)
	}

	for _, bad := range []payments.LedgerFilter{{Currency: "EU"}, {Type: "Payout"}, {From: day1.To, To: day1.From}} {
		if _, err := b.svc.ExportLedger(ctx, bad, func(payments.ExportedEntry) error { return nil }); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("export %+v: %v, want invalid", bad, err)
		}
	}
}

func TestFormatMinor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		amount   int64
		currency string
		want     string
	}{{1999, "EUR", "19.99"}, {5, "EUR", "0.05"}, {-5, "EUR", "-0.05"}, {500, "JPY", "500"}, {1500, "KWD", "1.500"}} {
		if got := payments.FormatMinor(c.amount, c.currency); got != c.want {
			t.Errorf("FormatMinor(%d, %s) = %q, want %q", c.amount, c.currency, got, c.want)
		}
	}
}

// A trial balance over whole UTC days (the console's date filter) is summed from the per-day
// deltas the ledger's trigger keeps, not from the entries; it must say exactly what summing the
// entries says, for every range and currency, before and after the deltas are folded. (Without
// the trigger, or with a delta lost or doubled by a fold, the sums differ.)
func TestTrialBalanceFromDayTotals(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.fourLedgerDays(t, "o-d")
	// Many more refund entries spread over days, written straight into the ledger (the trigger
	// sees every insert however it comes): enough delta rows that the next balance folds them.
	// Each names a refund row of its own (migration 00565), stored Failed so that the refund
	// rows themselves, which are not what this test is about, are not held to the amount.
	if _, err := b.pool.Exec(ctx, `WITH r AS (
			INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key, created_at, updated_at)
			SELECT gen_random_uuid(), session_id, order_id, 1, currency, 'Failed', 'fill-' || i, $1, $1
			FROM accounting_entries, generate_series(1, 300) i WHERE entry_type = 'PaymentReceived'
			RETURNING id, session_id, order_id, currency, substr(request_key, 6)::int AS i)
		INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, refund_id, created_at)
		SELECT order_id, session_id, 'RefundIssued', 1, currency, id, $1::timestamptz + (i % 5) * interval '1 day' + (i % 7) * interval '1 hour'
		FROM r`, t0); err != nil {
		t.Fatal(err)
	}
	direct := func(f payments.LedgerFilter) []payments.LedgerTotal {
		t.Helper()
		var out []payments.LedgerTotal
		rows, err := b.pool.Query(ctx, `SELECT currency, coalesce(sum(amount) FILTER (WHERE entry_type = 'PaymentReceived'), 0),
			coalesce(sum(amount) FILTER (WHERE entry_type = 'RefundIssued'), 0), count(*) FROM accounting_entries
			WHERE ($1::timestamptz IS NULL OR created_at >= $1) AND ($2::timestamptz IS NULL OR created_at < $2) AND ($3 = '' OR currency = $3)
			GROUP BY currency ORDER BY currency`, nullTime(f.From), nullTime(f.To), f.Currency)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var x payments.LedgerTotal
			if err := rows.Scan(&x.Currency, &x.Received, &x.Refunded, &x.Entries); err != nil {
				t.Fatal(err)
			}
			out = append(out, x)
		}
		return out
	}
	midnight := t0.UTC().Truncate(24 * time.Hour)
	day := func(d int) time.Time { return midnight.AddDate(0, 0, d) }
	filters := []payments.LedgerFilter{{}, {Currency: "EUR"}, {Currency: "USD"}, {From: day(1)}, {To: day(2)},
		{From: day(1), To: day(2)}, {From: day(1), To: day(4), Currency: "EUR"}, {From: day(5), To: day(9)}}
	check := func(when string) {
		t.Helper()
		for _, f := range filters {
			got, err := b.svc.TrialBalance(ctx, f)
			if want := direct(f); err != nil || !slices.Equal(got, want) {
				t.Fatalf("%s: trial balance %+v = %+v %v, summing the entries says %+v", when, f, got, err, want)
			}
		}
	}
	if n := b.count(t, `SELECT count(*) FROM ledger_day_deltas`); n <= 1000 {
		t.Fatalf("delta rows before = %d, want more than the fold threshold", n)
	}
	check("before the fold") // the first balance over everything folds
	if n, days := b.count(t, `SELECT count(*) FROM ledger_day_deltas`), b.count(t, `SELECT count(DISTINCT (day, currency)) FROM ledger_day_deltas`); n != days {
		t.Fatalf("delta rows after the fold = %d, want one per day and currency (%d)", n, days)
	}
	check("after the fold")
	b.ledgerDay(t, 2, "o-d5", 333, "USD", 0) // a new entry after the fold
	check("after a new entry")
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// The exports read a batch at a time and hold no connection while their reader takes its time.
// They streamed one statement's rows straight to the browser, so each download held a pool
// connection until its last row was written, and a finance user who opened as many downloads as
// the pool has connections and stopped reading starved every Create and /readyz of the replica
// (an outside review, resource exhaustion). Here the exports run on a pool of one connection and
// their reader, at the start of every batch, needs that connection for something else. Every
// entry is handed over once, across batch boundaries and ties of created_at. Negative control:
// the single streaming statement, the reader's look-up times out.
func TestExportsHoldNoConnectionWhileTheReaderWaits(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-export", 1000)
	n := 2*payments.ExportBatch + 500
	// Refund rows stored Failed (not held to the payment's amount), their entries booked straight
	// into the ledger, three to each created_at.
	b.exec(t, `WITH r AS (
			INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key, created_at, updated_at)
			SELECT gen_random_uuid(), $1, 'o-export', 1, 'EUR', 'Failed', 'fill-' || i, $2::timestamptz + (i / 3) * interval '1 second', $2
			FROM generate_series(1, $3::int) i RETURNING id, created_at)
		INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, refund_id, created_at)
		SELECT 'o-export', $1, 'RefundIssued', 1, 'EUR', id, created_at FROM r`, s.ID, b.clock.Now(), n)
	b.exec(t, `INSERT INTO audit_log (at, actor, role, action, target, detail)
		SELECT $1, 'fin@example.com', 'finance', 'payment.check', 'p-' || i, 'checked' FROM generate_series(1, $2::int) i`, b.clock.Now(), n)
	one := b.service(testdb.PoolOf(t, b.pool, 1), "one-connection")

	reader := func(i int) error {
		if i%payments.ExportBatch != 0 {
			return nil
		}
		wait, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := one.Get(wait, s.ID)
		return err
	}
	seen := map[int64]bool{}
	got, err := one.ExportLedger(ctx, payments.LedgerFilter{}, func(e payments.ExportedEntry) error {
		if seen[e.ID] {
			t.Fatalf("entry %d handed over twice", e.ID)
		}
		seen[e.ID] = true
		return reader(len(seen) - 1)
	})
	if err != nil || got != n+1 || len(seen) != n+1 {
		t.Fatalf("ledger export: %d entries (%d distinct), %v; want %d", got, len(seen), err, n+1)
	}
	want := b.count(t, `SELECT count(*) FROM audit_log`)
	seen = map[int64]bool{}
	got, err = one.ExportAudit(ctx, payments.AuditFilter{}, func(e payments.AuditEntry) error {
		if seen[e.ID] {
			t.Fatalf("audit entry %d handed over twice", e.ID)
		}
		seen[e.ID] = true
		return reader(len(seen) - 1)
	})
	if err != nil || got != want || len(seen) != want {
		t.Fatalf("audit export: %d entries (%d distinct), %v; want %d", got, len(seen), err, want)
	}
	if got, err := one.ExportAudit(ctx, payments.AuditFilter{Actor: "fin@example.com", Target: "p-7"}, func(payments.AuditEntry) error { return nil }); err != nil || got != 1 {
		t.Fatalf("audit export by actor and target: %d, %v; want 1", got, err)
	}
}

// A range is final once every writer that may have dated an entry inside it has committed or
// given up: a patrol drive within its lease, a "Check now" within its claim (longer than the
// lease by a lock timeout and some seconds), each lock wait within LockTimeout; never sooner
// than 5 minutes. With a long GATEWAY_TIMEOUT the lease alone fell short of Check now's bound.
func TestLedgerFinalAtOutlastsEveryWritersBound(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, timeout := range []time.Duration{time.Second, 10 * time.Second, 3 * time.Minute} {
		svc := b.service(b.pool, "ledger-final", func(c *payments.Config) { c.GatewayTimeout = timeout; c.LeaseDuration = 0 })
		wait := svc.LedgerFinalAt(end).Sub(end)
		lock := 5 * time.Second // the default LockTimeout
		if wait < 5*time.Minute || wait < payments.LeaseFor(timeout)+3*lock || wait < svc.CheckNowClaimTTL()+3*lock {
			t.Errorf("GATEWAY_TIMEOUT %s: final %s after the range's end; the lease is %s, Check now's claim %s",
				timeout, wait, payments.LeaseFor(timeout), svc.CheckNowClaimTTL())
		}
	}
}
