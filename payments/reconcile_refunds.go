package payments

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reading refunds back. A refund is settled Succeeded with its one RefundIssued entry on the
// gateway's word, and nothing asked about it again: the patrol drives only Pending refunds, a
// webhook re-checks the payment, and reconciliation compared only the payment. But a gateway may
// move a refund on after it said succeeded (Stripe moves a card refund succeeded → failed when the
// card is closed, and the money goes back to the merchant), and a refund settled Succeeded by hand
// (four eyes) may never have been made. The books then said the customer was refunded, and nobody
// was told otherwise (an outside review).
//
// So when reconciliation compares a Completed session it reads back that session's refunds
// settled Succeeded within ReconcileConfig.RefundReadBack (30 days by default), newest first and
// at most maxRefundsReadBack of them: by the gateway's refund id, or, for one settled by hand
// without it, looked up by our key (FindRefund, making nothing, as askRefund does). An answer
// that contradicts the books — failed at the gateway, another amount, another payment, no such
// refund — notes a gateway_mismatch case on the session (reconcileCase: one open case per session
// and kind, the news added to it; the refund's fact the one driveRefund words alike, so news
// finance resolved is not opened again while it stays the same). The refund's status and the
// ledger are never changed here: undoing a RefundIssued entry is money, which takes four eyes.
// A refund settled Failed by hand is read back alike (readBackFailedByHand): the gateway paying
// it after all is the contradiction there.
//
// An answer that says nothing (a timeout, a 5xx, our credentials refused, a gateway that cannot
// search its refunds) opens nothing: the session's other refunds are left for the next pass too
// (the gateway is probably down, and each call may wait a timeout), and the session counts as
// compared, since its payment was. A refund still pending at the gateway is no contradiction yet.
//
// The cost rides the pass: each session is compared once a pass (sessions changed within the
// lookback), so a refund is asked about once a pass, at most maxRefundsReadBack a session, and no
// more once it was settled longer ago than RefundReadBack. A refund is read back only while its
// payment is within the pass's window: settling a refund Succeeded moves its payment's
// updated_at (settleRefundRow), so that is at least the lookback (7 days) after it settled, also
// for a payment settled long before (docs/gateways.md says so).

// maxRefundsReadBack bounds the refunds read back per session compared: the newest ones settled.
// It keeps a session's comparison within its bound (two thirds of the leader TTL) at a few
// gateway calls beside the payment's own.
const maxRefundsReadBack = 10

// readBackRefunds reads back sess's refunds settled Succeeded, or Failed by hand, within window
// and notes the
// gateway's contradictions for finance. It returns an error only when the session's comparison
// must stop (its time is up, the database failed); the gateway not answering is no error.
func (s *Service) readBackRefunds(ctx context.Context, sess Session, rep *ReconcileReport, window time.Duration) error {
	rows, err := s.db.Query(ctx, `SELECT `+refundColumns+` FROM refunds
		WHERE session_id = $1 AND (status = 'Succeeded' OR `+failedByHand+`) AND updated_at > $2
		ORDER BY updated_at DESC, refunds.id LIMIT $3`, sess.ID, s.cfg.Clock.Now().Add(-window), maxRefundsReadBack)
	if err != nil {
		return fmt.Errorf("reconcile: refunds to read back: %w", err)
	}
	refunds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Refund, error) { return scanRefund(r) })
	if err != nil {
		return fmt.Errorf("reconcile: refunds to read back: %w", err)
	}
	for _, r := range refunds {
		gr, found, op, err := s.readBackRefund(ctx, sess, r)
		if op == "" {
			continue // settled by hand without the gateway's id, of a payment without one: nothing to ask by
		}
		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case gatewayNotFound(err):
			found, err = false, nil
		case GatewayErrorCode(err) == "unsupported":
			continue // a gateway that cannot search its refunds (refgw): nothing learnt, nothing sent
		case err != nil && (FailureOf(err) == FailureDefinitive || GatewayErrorCode(err) == "search_incomplete"):
			// This refund's look-up alone is refused (or cannot end): the session's older refunds
			// are still asked about (stopping here, one refund's repeating refusal hid a failed
			// one behind it every pass: a review).
			s.log.Warn("reconcile: refund not read back; asking at the next pass", "session", sess.ID, "refund", r.ID, "op", op, "err", err)
			continue
		case err != nil:
			s.log.Warn("reconcile: refund not read back; asking at the next pass", "session", sess.ID, "refund", r.ID, "op", op, "err", err)
			return nil
		}
		rep.RefundsReadBack++
		if r.Status == RefundFailed {
			if err := s.readBackFailedByHand(ctx, sess, rep, r, gr, found); err != nil {
				return err
			}
			continue
		}
		says, fact, mismatch := "", "", ""
		if found {
			mismatch = refundAnswerMismatch(sess, r, gr)
		}
		switch {
		case !found && r.GatewayRefundID != "":
			says = fmt.Sprintf("it has no refund %s", r.GatewayRefundID)
			fact = missingRefundFact(r)
		case !found:
			says = fmt.Sprintf("it has no refund of payment %s made with our key %s", sess.GatewayPaymentID, r.ID)
			fact = missingRefundFact(r)
		case mismatch != "":
			says = strings.TrimSuffix(mismatch, "; nothing applied")
			fact = refundFact(r.ID, r.Status, gr)
		case gr.Status == "failed":
			says = fmt.Sprintf("%s for its refund %s", gr.Status, gr.ID)
			fact = refundFact(r.ID, r.Status, gr)
		default:
			// Agrees, or has not ended yet (pending, or any status short of final, as driveRefund
			// reads it: a refund settled Succeeded by hand the gateway still processes): nothing to
			// tell; the next pass asks again (a status off the list opened a false case: a review).
		}
		if says == "" {
			continue
		}
		rep.RefundContradictions++
		detail := fmt.Sprintf("reconciliation: refund %s of %s %s is Succeeded here (settled %s, its RefundIssued entry is in the ledger), "+
			"but the gateway says %s: the customer may not have been refunded. Nothing was changed here: check the refund at the gateway, "+
			"refund the customer by hand there if they were not, then resolve this case with a note saying what was done",
			r.ID, FormatMinor(r.Amount, r.Currency), r.Currency, r.UpdatedAt.UTC().Format("2006-01-02 15:04 UTC"), says)
		if err := s.reconcileCase(ctx, sess, rep, CaseGatewayMismatch, detail, fact); err != nil {
			return err
		}
	}
	return nil
}

// readBackFailedByHand weighs the gateway's answer about r, a refund finance settled Failed by
// hand (four eyes: no RefundIssued entry, its amount refundable again): a refund the gateway
// paid after all contradicts the books. Only the payment's next refund asked
// (recheckRefundsFailedByHand), and one may never come: a refund paid a day after it was settled
// Failed stayed out of the books with nobody told (an outside review, chaos5). Its fact is the
// one that re-check words alike, so news finance resolved is not opened again. No such refund,
// failed, or still short of final agrees: a refund is settled Failed by hand mostly because the
// gateway left it pending, and a case at the next pass for what finance just decided on is noise
// (a review); the re-check before a new refund still refuses one while it is pending.
func (s *Service) readBackFailedByHand(ctx context.Context, sess Session, rep *ReconcileReport, r Refund, gr GatewayRefund, found bool) error {
	if !found || gr.Status != "succeeded" {
		return nil
	}
	// An answer about another refund is no word that this one was paid: the case told finance
	// to mark it Succeeded, a RefundIssued entry for money this customer never got (a review of
	// answers about other things; the re-check before a new refund refuses the same answer).
	about, err := refundAnswerAbout(ctx, s.db, sess, r, gr)
	if err != nil {
		return err
	}
	rep.RefundContradictions++
	if about != "" {
		detail := fmt.Sprintf("reconciliation: refund %s of %s %s is Failed here (%s), and asked about it the gateway answered about another refund: %s. "+
			"Nothing was changed here, and this answer is no reason to book it: check the refund at the gateway by our key %s, "+
			"then resolve this case with a note saying what was found",
			r.ID, FormatMinor(r.Amount, r.Currency), r.Currency, r.Detail, strings.TrimSuffix(about, "; nothing applied"), r.ID)
		return s.reconcileCase(ctx, sess, rep, CaseGatewayMismatch, detail, refundFact(r.ID, r.Status, gr))
	}
	says := fmt.Sprintf("%s for its refund %s (%d of payment %s)", gr.Status, orNone(gr.ID), gr.Amount, orNone(gr.PaymentID))
	detail := fmt.Sprintf("reconciliation: refund %s of %s %s is Failed here (%s; no RefundIssued entry, its amount refundable again), "+
		"but the gateway says %s: the customer may have been refunded and the books do not show it. Nothing was changed here: "+
		"check the refund at the gateway; if it was paid, mark it Succeeded on the payment's page (Settle by hand, approved by a second person), "+
		"then resolve this case with a note saying what was done",
		r.ID, FormatMinor(r.Amount, r.Currency), r.Currency, r.Detail, says)
	return s.reconcileCase(ctx, sess, rep, CaseGatewayMismatch, detail, refundFact(r.ID, r.Status, gr))
}

// readBackRefund asks the gateway about r, a settled refund of sess, making nothing: by the
// gateway's refund id, or by our key when it was settled without one (by hand). op is the call
// made ("" when there was nothing to ask by: no refund id and no payment id).
func (s *Service) readBackRefund(ctx context.Context, sess Session, r Refund) (gr GatewayRefund, found bool, op string, err error) {
	started := time.Now()
	switch {
	case r.GatewayRefundID != "":
		op = "refund_status"
		gr, err = s.gwOf(sess).RefundStatus(ctx, r.GatewayRefundID)
		found = err == nil
	case sess.GatewayPaymentID != "":
		op = "find_refund"
		gr, found, err = s.gwOf(sess).FindRefund(ctx, sess.GatewayPaymentID, r.ID)
	default:
		return gr, false, "", nil
	}
	s.logGatewayCall(ctx, sess.ID, op, r.ID, started, err)
	return gr, found, op, err
}

// missingRefundFact: the gateway has no refund r (by its id, or by our key when it has none), as
// a case's fact.
func missingRefundFact(r Refund) string {
	return fmt.Sprintf("refund %s (%s here): %s (missing)", r.ID, r.Status, orNone(r.GatewayRefundID))
}
