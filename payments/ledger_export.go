package payments

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The ledger for finance's books: entries exported a batch at a time (CSV export) and a trial balance
// per currency over the same filter.

// Ledger entry types.
const (
	EntryPaymentReceived = "PaymentReceived"
	EntryRefundIssued    = "RefundIssued"
)

// LedgerFilter narrows the ledger. Zero values: everything.
type LedgerFilter struct {
	From     time.Time // entries created at or after (zero: from the start)
	To       time.Time // entries created before (zero: until now)
	Currency string
	Type     string // EntryPaymentReceived, EntryRefundIssued or "" for both
}

// Validate checks the filter (and upper-cases the currency).
func (f LedgerFilter) Validate() (LedgerFilter, error) {
	f.Currency = strings.ToUpper(strings.TrimSpace(f.Currency))
	if f.Currency != "" && !validCurrency(f.Currency) {
		return f, Invalid("currency", "currency must be three letters like EUR")
	}
	if f.Type != "" && f.Type != EntryPaymentReceived && f.Type != EntryRefundIssued {
		return f, Invalid("type", "type must be %s or %s", EntryPaymentReceived, EntryRefundIssued)
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		return f, Invalid("to", "the end of the range must be after its start")
	}
	return f, nil
}

// where is the filter as SQL over accounting_entries; withType false leaves the entry type out
// (a trial balance needs both sides).
func (f LedgerFilter) where(withType bool) (string, []any) {
	conds := []string{"true"}
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if !f.From.IsZero() {
		add("created_at >= ?", f.From)
	}
	if !f.To.IsZero() {
		add("created_at < ?", f.To)
	}
	if f.Currency != "" {
		add("currency = ?", f.Currency)
	}
	if withType && f.Type != "" {
		add("entry_type = ?", f.Type)
	}
	return strings.Join(conds, " AND "), args
}

// LedgerFinalAt is when the ledger's entries dated before end are all written (writeLag after
// it). A day exported right after midnight could lack an entry dated 23:59:59 that committed a
// moment later, which no later day's export has either (an outside review): the ledger page says
// a range is not final until then, and exports of it may still change.
func (s *Service) LedgerFinalAt(end time.Time) time.Time {
	return end.Add(s.writeLag())
}

// writeLag is how much older than its commit a row's time may be (a ledger entry's created_at, a
// session's updated_at): its writer reads the clock, then waits for a connection within its
// work's bound (a request's, a patrol drive's lease, a "Check now"'s claim) and for the
// payment's locks (each wait within LockTimeout); replicas' clocks differ by a second or so
// (PitlaneClockOffset). At least 5 minutes.
func (s *Service) writeLag() time.Duration {
	return max(5*time.Minute, max(s.cfg.LeaseDuration, s.CheckNowClaimTTL())+3*s.cfg.LockTimeout)
}

// ExportedEntry is a ledger entry as exported: with the refund it books, if any.
type ExportedEntry struct {
	LedgerEntry
	RefundID string
}

// ExportBatch is how many rows an export reads per statement (ExportLedger, ExportAudit).
const ExportBatch = 1000

// ExportLedger calls fn for every entry under f, oldest first, read ExportBatch at a time by
// keyset (created_at, id; accounting_entries_created): no connection is held while fn runs, so a
// download its browser stopped reading holds no pool connection either (one export per
// connection of the pool starved every Create and /readyz of the replica: an outside review).
// The ledger is only appended to: every entry committed before the export began is in it once;
// one committed while it runs may be too. It stops at fn's first error.
func (s *Service) ExportLedger(ctx context.Context, f LedgerFilter, fn func(ExportedEntry) error) (int, error) {
	f, err := f.Validate()
	if err != nil {
		return 0, err
	}
	where, args := f.where(true)
	return exportInBatches(func(after *ExportedEntry) ([]ExportedEntry, error) {
		q, qargs := where, args
		if after != nil {
			q += fmt.Sprintf(" AND (created_at, id) > ($%d, $%d)", len(args)+1, len(args)+2)
			qargs = append(slices.Clip(args), after.CreatedAt, after.ID)
		}
		rows, err := s.db.Query(ctx, `SELECT id, order_id, session_id::text, entry_type, amount, currency, created_at, coalesce(refund_id::text, '')
			FROM accounting_entries WHERE `+q+` ORDER BY created_at, id LIMIT `+strconv.Itoa(ExportBatch), qargs...)
		if err != nil {
			return nil, fmt.Errorf("export ledger: %w", err)
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ExportedEntry, error) {
			var e ExportedEntry
			err := r.Scan(&e.ID, &e.OrderID, &e.SessionID, &e.Type, &e.Amount, &e.Currency, &e.CreatedAt, &e.RefundID)
			return e, err
		})
		if err != nil {
			return nil, fmt.Errorf("export ledger: %w", err)
		}
		return batch, nil
	}, fn)
}

// exportInBatches hands fn every row read gives, a batch at a time (read gets the last row of the
// batch before, nil for the first; a batch shorter than ExportBatch is the last), and returns
// how many it handed over. It stops at the first error of either.
func exportInBatches[T any](read func(after *T) ([]T, error), fn func(T) error) (int, error) {
	n := 0
	var after *T
	for {
		batch, err := read(after)
		if err != nil {
			return n, err
		}
		for _, r := range batch {
			if err := fn(r); err != nil {
				return n, err
			}
			n++
		}
		if len(batch) < ExportBatch {
			return n, nil
		}
		after = &batch[len(batch)-1]
	}
}

// TrialBalance sums the ledger per currency under f's date range and currency (both entry types
// always: received − refunded is the balance): what finance ties to the gateway's payouts.
// A range of whole UTC days (the console's date filter) is summed from the per-day deltas a
// trigger keeps (migration 00311), not from the entries: a page view stays cheap at millions of
// entries. Any other range sums the entries themselves.
func (s *Service) TrialBalance(ctx context.Context, f LedgerFilter) ([]LedgerTotal, error) {
	f, err := f.Validate()
	if err != nil {
		return nil, err
	}
	if wholeDay(f.From) && wholeDay(f.To) {
		return s.trialBalanceByDay(ctx, f)
	}
	where, args := f.where(false)
	out, _, err := s.trialBalance(ctx, `SELECT currency,
		coalesce(sum(amount) FILTER (WHERE entry_type = 'PaymentReceived'), 0)::bigint,
		coalesce(sum(abs(amount)) FILTER (WHERE entry_type = 'RefundIssued'), 0)::bigint,
		count(*), 0 FROM accounting_entries WHERE `+where+` GROUP BY currency ORDER BY currency`, args...)
	return out, err
}

// ledgerDeltaFold is how many day-delta rows a trial balance lets pile up beyond one per day and
// currency before it folds them.
const ledgerDeltaFold = 1000

// trialBalanceByDay sums ledger_day_deltas over f's days, and folds the deltas when many have
// piled up (one statement: the rows it deletes are the rows it sums, whoever folds at once).
func (s *Service) trialBalanceByDay(ctx context.Context, f LedgerFilter) ([]LedgerTotal, error) {
	conds, args := []string{"true"}, []any{}
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if !f.From.IsZero() {
		add("day >= ?::date", f.From.UTC().Format(time.DateOnly))
	}
	if !f.To.IsZero() {
		add("day < ?::date", f.To.UTC().Format(time.DateOnly))
	}
	if f.Currency != "" {
		add("currency = ?", f.Currency)
	}
	out, pending, err := s.trialBalance(ctx, `SELECT currency, sum(received)::bigint, sum(refunded)::bigint, sum(entries)::bigint,
		count(*) - count(DISTINCT day) FROM ledger_day_deltas WHERE `+strings.Join(conds, " AND ")+` GROUP BY currency ORDER BY currency`, args...)
	if err != nil {
		return nil, err
	}
	if pending > ledgerDeltaFold {
		if _, err := s.db.Exec(ctx, `WITH gone AS (DELETE FROM ledger_day_deltas RETURNING day, currency, received, refunded, entries)
			INSERT INTO ledger_day_deltas (day, currency, received, refunded, entries)
			SELECT day, currency, sum(received), sum(refunded), sum(entries) FROM gone GROUP BY day, currency`); err != nil {
			return nil, fmt.Errorf("trial balance: fold: %w", err)
		}
	}
	return out, nil
}

// trialBalance runs a trial balance query: per currency, received, refunded, entries, and the
// surplus rows a fold would remove (0 when summing the entries themselves).
func (s *Service) trialBalance(ctx context.Context, sql string, args ...any) (out []LedgerTotal, pending int, err error) {
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, 0, fmt.Errorf("trial balance: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t LedgerTotal
		var surplus int
		if err := rows.Scan(&t.Currency, &t.Received, &t.Refunded, &t.Entries, &surplus); err != nil {
			return nil, 0, fmt.Errorf("trial balance: %w", err)
		}
		out, pending = append(out, t), pending+surplus
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("trial balance: %w", err)
	}
	return out, pending, nil
}

// wholeDay reports whether t is unset or a UTC midnight: a bound the day deltas answer exactly.
func wholeDay(t time.Time) bool {
	return t.IsZero() || t.Equal(t.UTC().Truncate(24*time.Hour))
}

// LedgerEntries returns the newest entries under f (at most 500), for the ledger page.
func (s *Service) LedgerEntries(ctx context.Context, f LedgerFilter) ([]LedgerEntry, error) {
	f, err := f.Validate()
	if err != nil {
		return nil, err
	}
	where, args := f.where(true)
	// Newest by date, as the page's range is: a range ending in the past starts at its end in
	// accounting_entries_created, or in the currency's or the type's index (00930). By id, the
	// plan walked the whole ledger back from its newest entry, filtering out everything after
	// the range or in other currencies (an outside review of plans at scale).
	return s.ledgerEntries(ctx, where, `created_at DESC, id DESC`, args...)
}

// FormatMinor writes an amount in minor units in major units without the currency:
// FormatMinor(1999, "EUR") = "19.99", FormatMinor(500, "JPY") = "500", (-5, "EUR") = "-0.05".
func FormatMinor(amount int64, currency string) string {
	digits := MinorUnitDigits(currency)
	sign := ""
	u := uint64(amount)
	if amount < 0 {
		sign, u = "-", uint64(-amount)
	}
	s := strconv.FormatUint(u, 10)
	if digits > 0 {
		if len(s) <= digits {
			s = strings.Repeat("0", digits-len(s)+1) + s
		}
		s = s[:len(s)-digits] + "." + s[len(s)-digits:]
	}
	return sign + s
}
