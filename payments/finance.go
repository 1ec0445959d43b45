package payments

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Finance's own writes from the console: closing a case with a note, and sending a flagged
// session back to the patrol. Each is one short transaction audited in the same transaction
// (the four-eyes resolution's writes are in resolution.go, Check now's in finance_workbench.go).

// MaxResolutionLength bounds a resolution note.
const MaxResolutionLength = 2000

// ResolveCase closes an open case with a note (required: what was done, e.g. "refunded by hand,
// ticket 123"), and audits it in the same transaction. ECONFLICT when it was already resolved,
// or when seen (FinanceCase.Seen of the case as the person read it; "" for none) is not the case
// as it is now: news added to an open case (noteCase: the capture of a payment finance had read
// as an authorization that lapses) was resolved with it unread, and its facts counted as dealt
// with, so no finder raised it again (an outside review). Finance rows come last in the lock
// order, and this touches no other row.
func (s *Service) ResolveCase(ctx context.Context, by Staff, id int64, note, seen string) (FinanceCase, error) {
	note, err := requiredText("note", note, "say how the case was resolved", MaxResolutionLength)
	if err != nil {
		return FinanceCase{}, err
	}
	now := s.cfg.Clock.Now()
	err = s.inTx(ctx, "resolve case", func(tx pgx.Tx) error {
		var kind string
		err := tx.QueryRow(ctx, `UPDATE finance_cases SET resolved_at = $2, resolved_by = $3, resolution = $4
			WHERE id = $1 AND resolved_at IS NULL AND ($5 = '' OR `+caseSeenSQL("finance_cases")+` = $5) RETURNING kind`, id, now, by.Email, note, seen).Scan(&kind)
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
			if resolvedAt == nil {
				return Errorf(ECONFLICT, "case %d changed since you read it (something new was added to it): read it again, then resolve it; nothing was resolved", id)
			}
			return Errorf(ECONFLICT, "case %d was already resolved by %s", id, resolvedBy)
		}
		if err != nil {
			return fmt.Errorf("resolve case: %w", err)
		}
		if err := staffStands(ctx, tx); err != nil {
			return err
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditCaseResolve,
			Target: CaseTarget(id), Detail: kind + ": " + note}, now)
	})
	if err != nil {
		return FinanceCase{}, err
	}
	cases, err := s.listCases(ctx, s.db, `fc.id = $1`, `fc.id`, 1, id)
	if err != nil || len(cases) != 1 {
		return FinanceCase{}, fmt.Errorf("resolve case: read back: %w", err)
	}
	return cases[0], nil
}

// CaseTarget is how a case is named in the audit log.
func CaseTarget(id int64) string { return "case:" + strconv.FormatInt(id, 10) }

// RetryFlagged sends a flagged session back to the patrol now: the flag is cleared, the session
// is due at once (or once a registration its last look sent can no longer be in flight) and its
// backoff schedule starts over (a finance user who asks for a retry wants
// the patrol to keep looking, not to give up again after one more look). The sweep_exhausted
// case stays open until finance resolves it. Audited in the same transaction. It changes no
// status, so it takes only the session row (no order lock needed for the lock order). While a
// proposal to settle the session by hand waits, it is refused (ECONFLICT), as RetryFlaggedRefund
// is: the gateway is not asked while people decide, and the approval would otherwise settle a
// session the patrol is driving again.
func (s *Service) RetryFlagged(ctx context.Context, by Staff, id string) (Session, error) {
	if !validUUID(id) {
		return Session{}, Errorf(ENOTFOUND, "payment %q not found", id)
	}
	now := s.cfg.Clock.Now()
	var out Session
	err := s.inTx(ctx, "retry flagged", func(tx pgx.Tx) error {
		var reason, gatewayID string
		err := tx.QueryRow(ctx, `SELECT coalesce(flag_reason, ''), coalesce(gateway_payment_id, '') FROM payment_sessions
			WHERE id = $1 AND flagged_at IS NOT NULL AND `+activeStatusSQL+` FOR UPDATE`, id).Scan(&reason, &gatewayID)
		if errors.Is(err, pgx.ErrNoRows) {
			if _, gerr := getSession(ctx, tx, id); gerr != nil {
				return gerr
			}
			return Errorf(ECONFLICT, "payment %s is not flagged (or no longer active)", id)
		}
		if err != nil {
			return dbError("retry flagged: lock", err, "")
		}
		if err := staffStands(ctx, tx); err != nil {
			return err
		}
		if err := noSettleProposal(ctx, tx, "payment", id); err != nil {
			return err
		}
		// Due now — or once a registration sent on the schedule's last look and never answered
		// can no longer be in flight (the flag cleared the hold it left; Retry now registered
		// beside it: a review).
		due := now
		if gatewayID == "" { // one with its gateway id is never registered again
			if inFlight, err := registrationInFlight(ctx, tx, id, now, s.cfg.RegisterGrace); err != nil {
				return err
			} else if inFlight.After(due) {
				due = inFlight
			}
		}
		out, err = scanSession(tx.QueryRow(ctx, `UPDATE payment_sessions SET flagged_at = NULL, flag_reason = NULL,
			next_check_at = $2, check_attempts = 0 WHERE id = $1 RETURNING `+sessionColumns, id, due))
		if err != nil {
			return dbError("retry flagged", err, "")
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditFlagRetry,
			Target: out.ID, Detail: "flag cleared (" + reason + "); " + dueWhen(now, due)}, now)
	})
	return out, err
}

// RetryFlaggedRefund sends a flagged refund (its schedule ran out still Pending: a
// refund_unsettled case) back to the patrol now, like RetryFlagged does a session: the flag is
// cleared, the refund is due at once (or once a refund its last look sent can no longer be in
// flight: refundInFlight) and its schedule starts over. The patrol's drive asks the
// gateway in the way that never refunds twice (askRefund) and applies the answer as always. The
// case stays open until finance resolves it. Audited in the same transaction, under the
// payment (the refund's session) so the payment page shows it. It changes no status, so it
// takes only the refund row. While a proposal to settle the refund by hand waits, it is refused
// (ECONFLICT): the gateway is not asked while people decide.
func (s *Service) RetryFlaggedRefund(ctx context.Context, by Staff, id string) (Refund, error) {
	if !validUUID(id) {
		return Refund{}, Errorf(ENOTFOUND, "refund %q not found", id)
	}
	now := s.cfg.Clock.Now()
	var out Refund
	err := s.inTx(ctx, "retry flagged refund", func(tx pgx.Tx) error {
		var reason string
		err := tx.QueryRow(ctx, `SELECT coalesce(flag_reason, '') FROM refunds
			WHERE id = $1 AND flagged_at IS NOT NULL AND status = 'Pending' FOR UPDATE`, id).Scan(&reason)
		if errors.Is(err, pgx.ErrNoRows) {
			if _, gerr := scanRefund(tx.QueryRow(ctx, `SELECT `+refundColumns+` FROM refunds WHERE id = $1`, id)); gerr != nil {
				return dbError("retry flagged refund", gerr, "refund %q not found", id)
			}
			return Errorf(ECONFLICT, "refund %s is not flagged (or no longer Pending)", id)
		}
		if err != nil {
			return dbError("retry flagged refund: lock", err, "")
		}
		if err := staffStands(ctx, tx); err != nil {
			return err
		}
		if err := noSettleProposal(ctx, tx, "refund", id); err != nil {
			return err
		}
		// Due now — or once a refund sent on the schedule's last look and never answered can no
		// longer be in flight (the flag cleared the hold it left; Retry then sent it again beside
		// it past the gateway's key retention: a review, as RetryFlagged's registration).
		due := now
		if inFlight, err := refundInFlight(ctx, tx, id, now, s.cfg.RegisterGrace); err != nil {
			return err
		} else if inFlight.After(due) {
			due = inFlight
		}
		out, err = scanRefund(tx.QueryRow(ctx, `UPDATE refunds SET flagged_at = NULL, flag_reason = NULL,
			next_check_at = $2, check_attempts = 0 WHERE id = $1 RETURNING `+refundColumns, id, due))
		if err != nil {
			return dbError("retry flagged refund", err, "")
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditRefundRetry,
			Target: out.PaymentID, Detail: "refund " + id + ": flag cleared (" + reason + "); " + dueWhen(now, due)}, now)
	})
	return out, err
}

// noSettleProposal refuses (ECONFLICT) a retry of a flagged payment or refund (what: "payment"
// or "refund") while a proposal to settle it by hand waits: sending it back to the patrol would
// have the gateway asked while people decide its outcome, and the approval would then settle
// what the patrol drives again. The caller holds the row's lock, under which proposals are made
// too, so one of the two sees the other.
func noSettleProposal(ctx context.Context, tx pgx.Tx, what, id string) error {
	q := `SELECT id FROM resolution_proposals WHERE session_id = $1 AND kind = 'settle' AND state = 'proposed'`
	if what == "refund" {
		q = `SELECT id FROM resolution_proposals WHERE refund_id = $1 AND kind = 'refund_settle' AND state = 'proposed'`
	}
	var proposal int64
	switch err := tx.QueryRow(ctx, q, id).Scan(&proposal); {
	case err == nil:
		return Errorf(ECONFLICT, "proposal #%d to settle %s %s by hand waits for a second person: approve or reject it first", proposal, what, Short(id))
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("retry flagged %s: proposal: %w", what, err)
	}
	return nil
}

// flaggedRefundsSQL reads a page of flagged refunds through refunds_flagged (migration 00213);
// with keyset, those after ($1, $2) (flagArgs). flaggedRefundsCountSQL counts them all.
func flaggedRefundsSQL(keyset bool) string {
	return `SELECT ` + refundColumns + ` FROM refunds WHERE flagged_at IS NOT NULL AND status = 'Pending'` +
		flagKeyset(keyset) + ` ORDER BY flagged_at, refunds.id LIMIT ` + strconv.Itoa(FlaggedPerPage+1)
}

const flaggedRefundsCountSQL = `SELECT count(*) FROM refunds WHERE flagged_at IS NOT NULL AND status = 'Pending'`

// ListFlaggedRefunds returns a page of the refunds the patrol gave up on (flagged, still
// Pending), oldest flag first, after the cursor after (as ListFlagged), and how many there are in
// all; both read refunds_flagged (migration 00213).
func (s *Service) ListFlaggedRefunds(ctx context.Context, after string) (FlaggedRefunds, error) {
	var out FlaggedRefunds
	var err error
	out.Refunds, out.Total, out.Next, err = flaggedPage(ctx, s, "flagged refunds", "refunds_after", after,
		flaggedRefundsSQL, flaggedRefundsCountSQL, func(r pgx.CollectableRow) (Refund, error) { return scanRefund(r) },
		func(r Refund) (*time.Time, string) { return r.FlaggedAt, r.ID })
	return out, err
}

// dueWhen says in a Retry's audit line when the patrol looks again: now, or later when a send of
// the last look may still be in flight (the line said "due now" of one due 25 s later, a review).
func dueWhen(now, due time.Time) string {
	if !due.After(now) {
		return "due now"
	}
	return "due " + due.UTC().Format(time.RFC3339) + ": its last request to the gateway may still be in flight"
}
