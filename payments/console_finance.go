package payments

import (
	"context"
	"errors"
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
}

// Open reports whether the case awaits a resolution.
func (c FinanceCase) Open() bool { return c.ResolvedAt == nil }

func (s *Service) listCases(ctx context.Context, where string, args ...any) ([]FinanceCase, error) {
	rows, err := s.db.Query(ctx, `SELECT fc.id, coalesce(fc.session_id::text, ''), coalesce(fc.order_id, ''), fc.kind, fc.detail,
		fc.created_at, fc.resolved_at, coalesce(fc.resolved_by, ''), coalesce(fc.resolution, ''),
		coalesce(ps.amount, 0), coalesce(ps.currency, ''), coalesce(ps.status, '')
		FROM finance_cases fc LEFT JOIN payment_sessions ps ON ps.id = fc.session_id
		WHERE `+where+` ORDER BY fc.id DESC LIMIT 500`, args...)
	if err != nil {
		return nil, fmt.Errorf("finance cases: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FinanceCase, error) {
		var c FinanceCase
		var st string
		err := r.Scan(&c.ID, &c.SessionID, &c.OrderID, &c.Kind, &c.Detail, &c.CreatedAt, &c.ResolvedAt, &c.ResolvedBy,
			&c.Resolution, &c.Amount, &c.Currency, &st)
		c.SessionStatus = Status(st)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("finance cases: %w", err)
	}
	return out, nil
}

// ListCases returns finance cases newest first: the open ones, or all when all is set.
func (s *Service) ListCases(ctx context.Context, all bool) ([]FinanceCase, error) {
	if all {
		return s.listCases(ctx, `true`)
	}
	return s.listCases(ctx, `fc.resolved_at IS NULL`)
}

// MaxResolutionLength bounds a resolution note.
const MaxResolutionLength = 2000

// ResolveCase closes an open case with a note (required: what was done, e.g. "refunded by hand,
// ticket 123"), and audits it in the same transaction. ECONFLICT when it was already resolved.
// Finance rows come last in the lock order, and this touches no other row.
func (s *Service) ResolveCase(ctx context.Context, by Staff, id int64, note string) (FinanceCase, error) {
	note, err := requiredText("note", note, "say how the case was resolved", MaxResolutionLength)
	if err != nil {
		return FinanceCase{}, err
	}
	now := s.cfg.Clock.Now()
	err = s.inTx(ctx, "resolve case", func(tx pgx.Tx) error {
		var kind string
		err := tx.QueryRow(ctx, `UPDATE finance_cases SET resolved_at = $2, resolved_by = $3, resolution = $4
			WHERE id = $1 AND resolved_at IS NULL RETURNING kind`, id, now, by.Email, note).Scan(&kind)
		if errors.Is(err, pgx.ErrNoRows) {
			var resolvedBy string
			var resolvedAt *time.Time
			err := tx.QueryRow(ctx, `SELECT coalesce(resolved_by, ''), resolved_at FROM finance_cases WHERE id = $1`, id).Scan(&resolvedBy, &resolvedAt)
			if errors.Is(err, pgx.ErrNoRows) {
				return Errorf(ENOTFOUND, "case %d not found", id)
			}
			if err != nil {
				return fmt.Errorf("resolve case: %w", err)
			}
			return Errorf(ECONFLICT, "case %d was already resolved by %s", id, resolvedBy)
		}
		if err != nil {
			return fmt.Errorf("resolve case: %w", err)
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditCaseResolve,
			Target: CaseTarget(id), Detail: kind + ": " + note}, now)
	})
	if err != nil {
		return FinanceCase{}, err
	}
	cases, err := s.listCases(ctx, `fc.id = $1`, id)
	if err != nil || len(cases) != 1 {
		return FinanceCase{}, fmt.Errorf("resolve case: read back: %w", err)
	}
	return cases[0], nil
}

// CaseTarget is how a case is named in the audit log.
func CaseTarget(id int64) string { return "case:" + strconv.FormatInt(id, 10) }

// ListFlagged returns the active sessions the patrol gave up on (its schedule ran out), oldest
// flag first.
func (s *Service) ListFlagged(ctx context.Context) ([]Session, error) {
	rows, err := s.db.Query(ctx, `SELECT `+sessionColumns+` FROM payment_sessions
		WHERE flagged_at IS NOT NULL AND status = ANY($1) ORDER BY flagged_at, id LIMIT 500`, statusStrings(ActiveStatuses))
	if err != nil {
		return nil, fmt.Errorf("flagged sessions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) { return scanSession(r) })
	if err != nil {
		return nil, fmt.Errorf("flagged sessions: %w", err)
	}
	return out, nil
}

// RetryFlagged sends a flagged session back to the patrol now: the flag is cleared, the session
// is due at once and its backoff schedule starts over (a finance user who asks for a retry wants
// the patrol to keep looking, not to give up again after one more look). The sweep_exhausted
// case stays open until finance resolves it. Audited in the same transaction. It changes no
// status, so it takes only the session row (no order lock needed for the lock order).
func (s *Service) RetryFlagged(ctx context.Context, by Staff, id string) (Session, error) {
	if !validUUID(id) {
		return Session{}, Errorf(ENOTFOUND, "payment %q not found", id)
	}
	now := s.cfg.Clock.Now()
	var out Session
	err := s.inTx(ctx, "retry flagged", func(tx pgx.Tx) error {
		var reason string
		err := tx.QueryRow(ctx, `SELECT coalesce(flag_reason, '') FROM payment_sessions
			WHERE id = $1 AND flagged_at IS NOT NULL AND status = ANY($2) FOR UPDATE`, id, statusStrings(ActiveStatuses)).Scan(&reason)
		if errors.Is(err, pgx.ErrNoRows) {
			if _, gerr := getSession(ctx, tx, id); gerr != nil {
				return gerr
			}
			return Errorf(ECONFLICT, "payment %s is not flagged (or no longer active)", id)
		}
		if err != nil {
			return dbError("retry flagged: lock", err, "")
		}
		out, err = scanSession(tx.QueryRow(ctx, `UPDATE payment_sessions SET flagged_at = NULL, flag_reason = NULL,
			next_check_at = $2, check_attempts = 0 WHERE id = $1 RETURNING `+sessionColumns, id, now))
		if err != nil {
			return dbError("retry flagged", err, "")
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditFlagRetry,
			Target: id, Detail: "flag cleared (" + reason + "); due now"}, now)
	})
	return out, err
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

func (s *Service) ledgerEntries(ctx context.Context, where string, args ...any) ([]LedgerEntry, error) {
	rows, err := s.db.Query(ctx, `SELECT id, order_id, session_id::text, entry_type, amount, currency, created_at
		FROM accounting_entries WHERE `+where+` ORDER BY id DESC LIMIT 500`, args...)
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
