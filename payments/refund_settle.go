package payments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// A refund settled by hand, with four eyes. When a refund's patrol schedule ran out still
// Pending (flagged, a refund_unsettled case) and asking again does not help — the gateway keeps
// saying "pending", or has no record and its support says what happened — finance proposes the
// outcome with the evidence, and a second finance or admin user approves it (the machinery of
// resolution.go: kind ProposalRefundSettle). Until then the refund's amount stays counted as
// refunded; after a Failed outcome it may be refunded again — a new refund of the payment first
// asks the gateway again about each refund settled Failed by hand that it knows by id, and is
// refused while the gateway says it succeeded or is pending (recheckRefundsFailedByHand) —
// after a Succeeded one the ledger has its RefundIssued entry.

// A refund settled Failed by hand that the gateway pays after all (days late) is corrected the
// same way, to Succeeded only: a new refund of the payment is refused while the gateway says it
// paid it (recheckRefundsFailedByHand), and nothing else would ever write its RefundIssued entry
// or free what is really left of the payment (an outside review: every later refund refused for
// good, the books short by the refund).

// RefundOutcomeInput is finance's proposed outcome for a refund stuck Pending (or settled
// Failed by hand and paid by the gateway after all: Succeeded).
type RefundOutcomeInput struct {
	RefundID string
	Outcome  string // RefundSucceeded or RefundFailed
	Reason   string
	Evidence string
}

// ProposeRefundOutcome records finance's proposed outcome for a flagged Pending refund (or the
// correction of one settled Failed by hand to Succeeded), audited in the same transaction. It changes no refund: the order → session → refund locks only make
// the eligibility it checks the one a concurrent drive or approval leaves behind.
func (s *Service) ProposeRefundOutcome(ctx context.Context, by Staff, in RefundOutcomeInput) (Resolution, error) {
	if in.Outcome != RefundSucceeded && in.Outcome != RefundFailed {
		return Resolution{}, Invalid("outcome", "choose Succeeded (the money went back) or Failed (it did not)")
	}
	var err error
	if in.Reason, err = requiredText("reason", in.Reason, "say why this outcome is right", MaxReasonLength); err != nil {
		return Resolution{}, err
	}
	if in.Evidence, err = requiredText("evidence", in.Evidence, "give the evidence (gateway support, bank statement, ticket)", MaxEvidenceLength); err != nil {
		return Resolution{}, err
	}
	r, err := s.GetRefund(ctx, in.RefundID)
	if err != nil {
		return Resolution{}, err
	}
	now := s.cfg.Clock.Now()
	var id int64
	err = s.inTx(ctx, "propose refund outcome", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, r.OrderID, r.PaymentID)
		if err != nil {
			return err
		}
		locked, err := lockRefund(ctx, tx, r.ID)
		if err != nil {
			return err
		}
		switch {
		case locked.FailedByHand() && in.Outcome != RefundSucceeded:
			return Invalid("outcome", "refund %s was settled Failed by hand already: it can only be corrected to Succeeded (the money went back after all)", Short(r.ID))
		case locked.FailedByHand():
		case locked.Status != RefundPending:
			return Errorf(ECONFLICT, "refund %s is %s already: there is nothing to settle", Short(r.ID), locked.Status)
		case locked.FlaggedAt == nil:
			return Errorf(ECONFLICT, "only a flagged refund is settled by hand; the patrol still asks the gateway about refund %s", Short(r.ID))
		}
		if err := noProposalWaiting(ctx, tx, cur, by, now); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `INSERT INTO resolution_proposals (session_id, order_id, kind, refund_id, refund_outcome,
				status_at_proposal, reason, evidence, proposed_by, proposed_at, refund_from)
			VALUES ($1, $2, 'refund_settle', $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id`,
			cur.ID, cur.OrderID, r.ID, in.Outcome, string(cur.Status), in.Reason, in.Evidence, by.Email, now, locked.Status).Scan(&id); err != nil {
			return dbError("propose refund outcome", err, "")
		}
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditResolutionPropose, Target: cur.ID,
			Detail: fmt.Sprintf("#%d refund %s %s → %s: %s", id, r.ID, locked.Status, in.Outcome, in.Reason)}, now)
	})
	if err != nil {
		return Resolution{}, err
	}
	return getResolution(ctx, s.db, id)
}

// lockRefund reads a refund FOR UPDATE (after its order and session: the lock order).
func lockRefund(ctx context.Context, tx pgx.Tx, id string) (Refund, error) {
	r, err := scanRefund(tx.QueryRow(ctx, `SELECT `+refundColumns+` FROM refunds WHERE id = $1 FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Refund{}, Errorf(ENOTFOUND, "refund %q not found", id)
	}
	if err != nil {
		return Refund{}, dbError("refund: lock", err, "")
	}
	return r, nil
}

// approveRefundOutcome is the approval's effect for a refund_settle proposal p, in
// ApproveResolution's transaction under the order → session locks: the refund, still Pending,
// gets the proposed outcome (settleRefundRow: its feed event by staff, the flag cleared,
// Succeeded writes the RefundIssued entry), and the session's refund_unsettled case is resolved when no other refund
// of it is left flagged. A refund that moved since the proposal (the gateway answered after a
// retry) is a conflict: the approval does not happen. So is one no longer flagged (sent back to
// the patrol, which may be asking the gateway right now): only a refund nobody drives is
// settled by hand. (Nothing but the patrol drives a flagged refund's kind: a request drives
// only the refund it created, settleRefund, and a flagged one is never new.) A refund settled
// Failed by hand is corrected to Succeeded only while the refunds of the payment leave room for
// it again; nothing drives it either.
func (s *Service) approveRefundOutcome(ctx context.Context, tx pgx.Tx, cur Session, p Resolution, by Staff, now time.Time) error {
	r, err := lockRefund(ctx, tx, p.RefundID)
	if err != nil {
		return err
	}
	switch {
	case r.Status != p.RefundFrom:
		return Errorf(ECONFLICT, "refund %s is %s already (the gateway answered since the proposal): reject the proposal", Short(r.ID), r.Status)
	case r.FailedByHand() && p.RefundOutcome == RefundSucceeded:
		// The correction: its amount is taken again, within what the payment received (a
		// refund made meanwhile may have used it: then the books cannot say both, and finance
		// must sort it out with the gateway first). A gateway refund another of our refunds
		// holds is that one's: booked here too, one refund at the gateway was two RefundIssued
		// entries (a review).
		// The gateway refund it is booked with: the one on its row — kept there only under the
		// gateway-refund lock once no other refund held it — or, with none there, those its
		// cases name: an answer about another refund is not kept on the row, and the approval
		// booked a refund with no id whose only answer was another payment's refund (a review).
		// A row's own id decides alone: an earlier answer about another refund, noted for good,
		// refused the correction of a refund the gateway did pay (a review of that).
		named := []string{r.GatewayRefundID}
		if r.GatewayRefundID == "" {
			if named, err = refundFactGatewayRefunds(ctx, tx, cur.ID, r.ID); err != nil {
				return err
			}
			slices.Sort(named) // one lock order
		}
		for _, id := range named {
			if err := lockGatewayRefund(ctx, tx, cur, id); err != nil {
				return err
			}
		}
		var other string
		if r.GatewayRefundID != "" {
			other, err = gatewayRefundHolder(ctx, tx, cur, r.ID, r.GatewayRefundID)
		} else {
			other, err = refundFactHolder(ctx, tx, cur.ID, r.ID) // each id matched whole, also one the parse cut
		}
		if err != nil {
			return err
		}
		if other != "" {
			return Errorf(ECONFLICT, "refund %s cannot be marked Succeeded: a gateway refund it was answered with is refund %s's here; reject the proposal and settle it with the gateway",
				Short(r.ID), Short(other))
		}
		if _, _, err := refundRoom(ctx, tx, cur, r.Amount, false); err != nil {
			if ErrorCode(err) != ECONFLICT {
				return err
			}
			return Errorf(ECONFLICT, "refund %s cannot be marked Succeeded: %s; reject the proposal and settle the difference with the gateway",
				Short(r.ID), ErrorMessage(err))
		}
	case r.Status != RefundPending:
		// (Failed by hand, proposed Failed: never filed, ProposeRefundOutcome refuses it.)
		return Errorf(ECONFLICT, "refund %s is %s already: reject the proposal", Short(r.ID), r.Status)
	case r.FlaggedAt == nil:
		// Sent back to the patrol since the proposal ("Retry now"): its drive may be asking the
		// gateway right now, and an outcome by hand must never race the gateway's own answer.
		return Errorf(ECONFLICT, "refund %s went back to the patrol since the proposal and is being asked about again: reject the proposal, and propose again if the patrol flags it again", Short(r.ID))
	}
	detail := fmt.Sprintf("settled by hand: resolution #%d, proposed by %s, approved by %s", p.ID, p.ProposedBy, by.Email)
	if _, err := settleRefundRow(ctx, tx, r, p.RefundOutcome, detail, "", by.Actor(), now); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE finance_cases SET resolved_at = $2, resolved_by = $3, resolution = $4
		WHERE session_id = $1 AND kind = $5 AND resolved_at IS NULL
		  AND NOT EXISTS (SELECT 1 FROM refunds WHERE session_id = $1 AND status = 'Pending' AND flagged_at IS NOT NULL)`,
		cur.ID, now, by.Email, fmt.Sprintf("refund %s settled as %s by resolution #%d (proposed by %s)", r.ID, p.RefundOutcome, p.ID, p.ProposedBy),
		CaseRefundUnsettled); err != nil {
		return fmt.Errorf("approve refund outcome: cases: %w", err)
	}
	return nil
}
