package payments

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// FinanceCase is something finance must look at (see the Case* kinds in check.go).
type FinanceCase struct {
	ID         int64
	SessionID  string
	OrderID    string
	Kind       string
	Detail     string
	CreatedAt  time.Time
	ResolvedAt *time.Time
	ResolvedBy string
	Resolution string
	// The session's money and status, for the list (zero when the case has no session).
	Amount        int64
	Currency      string
	SessionStatus Status
	seen          string // caseSeenSQL when read
}

// Open reports whether the case awaits a resolution.
func (c FinanceCase) Open() bool { return c.ResolvedAt == nil }

// Seen names the case as read (caseSeenSQL when it was read): the resolve form sends it back,
// and ResolveCase refuses a case that changed since.
func (c FinanceCase) Seen() string { return c.seen }

// caseSeenSQL names a case as it is now, of the finance_cases row of alias: the MD5 of its detail
// and its facts (news added to an open case, noteCase, adds both; past the detail's 8,000-character
// cap only its facts change: an outside review resolved a capture unread that way). A version
// tag, not a secret.
func caseSeenSQL(alias string) string {
	return `md5(` + alias + `.detail || E'\n' || array_to_string(` + alias + `.facts, E'\n'))`
}

// listCases reads the cases under where (its arguments args), in order, at most limit.
func (s *Service) listCases(ctx context.Context, q querier, where, order string, limit int, args ...any) ([]FinanceCase, error) {
	rows, err := q.Query(ctx, `SELECT fc.id, coalesce(fc.session_id::text, ''), coalesce(fc.order_id, ''), fc.kind, fc.detail,
		fc.created_at, fc.resolved_at, coalesce(fc.resolved_by, ''), coalesce(fc.resolution, ''),
		coalesce(ps.amount, 0), coalesce(ps.currency, ''), coalesce(ps.status, ''), `+caseSeenSQL("fc")+`
		FROM finance_cases fc LEFT JOIN payment_sessions ps ON ps.id = fc.session_id
		WHERE `+where+` ORDER BY `+order+` LIMIT `+strconv.Itoa(limit), args...)
	if err != nil {
		return nil, fmt.Errorf("finance cases: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FinanceCase, error) {
		var c FinanceCase
		var st string
		err := r.Scan(&c.ID, &c.SessionID, &c.OrderID, &c.Kind, &c.Detail, &c.CreatedAt, &c.ResolvedAt, &c.ResolvedBy,
			&c.Resolution, &c.Amount, &c.Currency, &st, &c.seen)
		c.SessionStatus = Status(st)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("finance cases: %w", err)
	}
	return out, nil
}

// CasesPerPage is how many cases the cases page lists at once.
const CasesPerPage = 200

// CasePage is one page of the cases list.
type CasePage struct {
	Cases []FinanceCase
	// Open counts every open case, on this page or not.
	Open int64
	// Next is the id the next page starts after (ListCases' after); 0 on the last page.
	Next int64
}

// ListCases returns a page of finance cases after the case id after (0: from the start): the
// open ones oldest first (the longest waiting are the most urgent, and none is ever out of
// reach), or with all every case newest first (the history), with the count of open cases.
// Both read by index (finance_cases_open, migration 00540; the primary key).
func (s *Service) ListCases(ctx context.Context, all bool, after int64) (CasePage, error) {
	var p CasePage
	// The count and the list from one snapshot (readPage): a case resolved between them was
	// listed as open under a count without it.
	err := s.readPage(ctx, "finance cases", func(q querier) error {
		if err := q.QueryRow(ctx, `SELECT count(*) FROM finance_cases WHERE resolved_at IS NULL`).Scan(&p.Open); err != nil {
			return fmt.Errorf("finance cases: count: %w", err)
		}
		var err error
		switch {
		case all && after > 0:
			p.Cases, err = s.listCases(ctx, q, `fc.id < $1`, `fc.id DESC`, CasesPerPage+1, after)
		case all:
			p.Cases, err = s.listCases(ctx, q, `true`, `fc.id DESC`, CasesPerPage+1)
		default:
			p.Cases, err = s.listCases(ctx, q, `fc.resolved_at IS NULL AND fc.id > $1`, `fc.id`, CasesPerPage+1, after)
		}
		return err
	})
	if err != nil {
		return p, err
	}
	if len(p.Cases) > CasesPerPage {
		p.Cases = p.Cases[:CasesPerPage]
		p.Next = p.Cases[CasesPerPage-1].ID
	}
	return p, nil
}

// FlaggedPerPage is how many flagged sessions, and how many flagged refunds, one page of
// /finance/flagged lists; each list continues on pages of its own (Next).
const FlaggedPerPage = 500

// FlaggedSessions is one page of the active sessions the patrol gave up on: Total counts them
// all, Next continues the list ("" at its end).
type FlaggedSessions struct {
	Sessions []Session
	Total    int64
	Next     string
}

// FlaggedRefunds is FlaggedSessions for the refunds the patrol gave up on.
type FlaggedRefunds struct {
	Refunds []Refund
	Total   int64
	Next    string
}

// flagCursor reads the After of a flagged list ("" for its first page): the flag time in
// microseconds and the id of the last row shown. field names the query parameter it came in.
func flagCursor(field, after string) (at time.Time, id string, err error) {
	if after == "" {
		return time.Time{}, "", nil
	}
	n, id, ok := cutCursor(after)
	if !ok || !cursorTimeInRange(n) {
		return time.Time{}, "", Invalid(field, "%s must be the cursor of a flagged list's page", field)
	}
	return time.UnixMicro(n).UTC(), id, nil
}

// flagKeyset is the condition of a flagged list's page after a cursor, on flagArgs (a row
// comparison, so an index on (flagged_at, id) reads it as a range); nothing for a first page.
func flagKeyset(keyset bool) string {
	if !keyset {
		return ""
	}
	return ` AND (flagged_at, id) > ($1, $2::uuid)`
}

// flagArgs are flagKeyset's arguments.
func flagArgs(at time.Time, id string) []any {
	if id == "" {
		return nil
	}
	return []any{at, id}
}

// flagNext is the After that continues a flagged list after the row flagged at at with id.
func flagNext(at *time.Time, id string) string { return timeCursor(*at, id) }

// flaggedSessionsSQL reads a page of flagged sessions, with keyset those after ($1, $2), and
// flaggedSessionsCountSQL counts them all: both read the active part of payment_sessions only
// (payment_sessions_stuck_by_age holds flagged_at; TestStuckQueriesUseIndexesAtScale).
func flaggedSessionsSQL(keyset bool) string {
	return `SELECT ` + sessionColumns + ` FROM payment_sessions WHERE flagged_at IS NOT NULL AND ` + activeStatusSQL +
		flagKeyset(keyset) + ` ORDER BY flagged_at, payment_sessions.id LIMIT ` + strconv.Itoa(FlaggedPerPage+1)
}

var flaggedSessionsCountSQL = `SELECT count(*) FROM payment_sessions WHERE flagged_at IS NOT NULL AND ` + activeStatusSQL

// ListFlagged returns a page of the active sessions the patrol gave up on (its schedule ran
// out), oldest flag first, after the cursor after (the Next of the page before, "" for the
// first), and how many there are in all.
func (s *Service) ListFlagged(ctx context.Context, after string) (FlaggedSessions, error) {
	var out FlaggedSessions
	var err error
	out.Sessions, out.Total, out.Next, err = flaggedPage(ctx, s, "flagged sessions", "after", after,
		flaggedSessionsSQL, flaggedSessionsCountSQL, func(r pgx.CollectableRow) (Session, error) { return scanSession(r) },
		func(s Session) (*time.Time, string) { return s.FlaggedAt, s.ID })
	return out, err
}

// flaggedPage reads a page of a flagged list after the cursor after (query parameter field):
// listSQL's rows (one more than a page, to know there is a next), the count of all, and the
// cursor of the next page ("" at the end). what names the list in errors.
func flaggedPage[T any](ctx context.Context, s *Service, what, field, after string, listSQL func(keyset bool) string, countSQL string,
	scan func(pgx.CollectableRow) (T, error), key func(T) (*time.Time, string)) (rows []T, total int64, next string, err error) {
	at, id, err := flagCursor(field, after)
	if err != nil {
		return nil, 0, "", err
	}
	// The rows and the count from one snapshot (readPage): a payment settled between the two
	// reads was listed under a count without it (an outside review, numbers2).
	err = s.readPage(ctx, what, func(q querier) error {
		res, err := q.Query(ctx, listSQL(id != ""), flagArgs(at, id)...)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if rows, err = pgx.CollectRows(res, scan); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err = q.QueryRow(ctx, countSQL).Scan(&total); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
	if err != nil {
		return nil, 0, "", err
	}
	if len(rows) > FlaggedPerPage {
		rows = rows[:FlaggedPerPage]
		next = flagNext(key(rows[FlaggedPerPage-1]))
	}
	return rows, total, next, nil
}

// LedgerEntry is one accounting entry.
type LedgerEntry struct {
	ID        int64
	OrderID   string
	SessionID string
	Type      string // PaymentReceived | RefundIssued
	Amount    int64
	Currency  string
	CreatedAt time.Time
}

// LedgerTotal sums the ledger of one currency.
type LedgerTotal struct {
	Currency string
	Received int64
	Refunded int64
	Entries  int
}

// Net is what was received less what was refunded.
func (t LedgerTotal) Net() int64 { return t.Received - t.Refunded }

// ledgerEntries is the newest 500 entries under where, in order (an ORDER BY its indexes serve),
// planned with its values every time: one cached statement serves both entry types, and once
// its generic plan was chosen (after five pages of PaymentReceived) the rare RefundIssued walked
// the whole ledger (the session's own review).
func (s *Service) ledgerEntries(ctx context.Context, where, order string, args ...any) ([]LedgerEntry, error) {
	rows, err := s.db.Query(ctx, `SELECT id, order_id, session_id::text, entry_type, amount, currency, created_at
		FROM accounting_entries WHERE `+where+` ORDER BY `+order+` LIMIT 500`, append([]any{pgx.QueryExecModeExec}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LedgerEntry, error) {
		var e LedgerEntry
		err := r.Scan(&e.ID, &e.OrderID, &e.SessionID, &e.Type, &e.Amount, &e.Currency, &e.CreatedAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	return out, nil
}
