package payments

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The ledger for finance's books: entries streamed row by row (CSV export) and a trial balance
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
	if f.Currency != "" && !currencyRe.MatchString(f.Currency) {
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

// ExportedEntry is a ledger entry as exported: with the refund it books, if any.
type ExportedEntry struct {
	LedgerEntry
	RefundID string
}

// ExportLedger calls fn for every entry under f, oldest first, as PostgreSQL sends them: pgx
// reads the result from the connection row by row, so memory does not grow with the ledger.
// One statement, so the export is one consistent snapshot. It stops at fn's first error.
func (s *Service) ExportLedger(ctx context.Context, f LedgerFilter, fn func(ExportedEntry) error) (int, error) {
	f, err := f.Validate()
	if err != nil {
		return 0, err
	}
	where, args := f.where(true)
	rows, err := s.db.Query(ctx, `SELECT id, order_id, session_id::text, entry_type, amount, currency, created_at, coalesce(refund_id::text, '')
		FROM accounting_entries WHERE `+where+` ORDER BY created_at, id`, args...)
	if err != nil {
		return 0, fmt.Errorf("export ledger: %w", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var e ExportedEntry
		if err := rows.Scan(&e.ID, &e.OrderID, &e.SessionID, &e.Type, &e.Amount, &e.Currency, &e.CreatedAt, &e.RefundID); err != nil {
			return n, fmt.Errorf("export ledger: %w", err)
		}
		if err := fn(e); err != nil {
			return n, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("export ledger: %w", err)
	}
	return n, nil
}

// TrialBalance sums the ledger per currency under f's date range and currency (both entry types
// always: received − refunded is the balance): what finance ties to the gateway's payouts.
func (s *Service) TrialBalance(ctx context.Context, f LedgerFilter) ([]LedgerTotal, error) {
	f, err := f.Validate()
	if err != nil {
		return nil, err
	}
	where, args := f.where(false)
	rows, err := s.db.Query(ctx, `SELECT currency,
		coalesce(sum(amount) FILTER (WHERE entry_type = 'PaymentReceived'), 0)::bigint,
		coalesce(sum(abs(amount)) FILTER (WHERE entry_type = 'RefundIssued'), 0)::bigint,
		count(*) FROM accounting_entries WHERE `+where+` GROUP BY currency ORDER BY currency`, args...)
	if err != nil {
		return nil, fmt.Errorf("trial balance: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LedgerTotal, error) {
		var t LedgerTotal
		err := r.Scan(&t.Currency, &t.Received, &t.Refunded, &t.Entries)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("trial balance: %w", err)
	}
	return out, nil
}

// LedgerEntries returns the newest entries under f (at most 500), for the ledger page.
func (s *Service) LedgerEntries(ctx context.Context, f LedgerFilter) ([]LedgerEntry, error) {
	f, err := f.Validate()
	if err != nil {
		return nil, err
	}
	where, args := f.where(true)
	return s.ledgerEntries(ctx, where, args...)
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
