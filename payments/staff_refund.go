package payments

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Refunds people start from the console. Every one is claimed through the refund core
// (claimRefund: the payment Completed, the refunds within the amount received, exactly one
// RefundIssued entry when the gateway confirms) and asked of the gateway after commit. Three
// ways in, by who asks:
//
//   - support: the customer confirms with a one-time code (RequestRefundCode sends it and
//     names the amount, ConfirmRefund spends it and claims the refund in ONE transaction). The
//     code machinery is cancel's (code.go): one budget of codes and guesses per payment.
//   - finance, within REFUND_DIRECT_LIMIT: RefundByFinance claims the refund at once.
//   - finance, above it: RefundByFinance records a four-eyes proposal instead
//     (resolution.go); a second finance or admin user's approval claims the refund.
//
// The limit counts the payment's refunds together (every refund but a Failed one, a refund
// proposal still waiting, and this one), judged under the order → session locks, so neither
// splitting a refund into small ones nor two people refunding at once moves more than the limit
// without a second person. While a refund proposal waits, its amount is spoken for: a support
// code, a finance refund or another proposal that would leave too little for it is refused
// (refundRoom), so no one at the console gives away money a waiting approval needs. The shop's
// API refunds are the shop's own decisions and are not held back by a proposal.
//
// Each console form carries an intent key rendered into it (like the checkout's Pay form): its
// refund's request key is "console/<intent>", so however often one form is submitted (a double
// click, a resubmit after a lost answer) it makes one refund, or one code, or one proposal.
// The intent key tells the same form apart, not the same intention: a second form of a page read
// before a refund (another tab, a second finance user, the shop's API) asked for the same money
// again. So each form also carries what counted against the refundable amount on its page
// (seen), and a form whose page the payment's refunds outran is refused (refundsAsSeen).

// Audit actions of console refunds (the four-eyes steps are resolution.propose/approve/reject).
const (
	AuditRefundRequest = "payment.refund_request" // support: a code went to the customer
	AuditRefundConfirm = "payment.refund_confirm" // support: the customer's code confirmed the refund
	AuditRefund        = "payment.refund"         // finance: a direct refund
)

// StaffRefundInput is one console refund form.
type StaffRefundInput struct {
	PaymentID string
	Amount    int64
	Reason    string
	// IntentKey is the form's intent key (a UUID rendered into the form).
	IntentKey string
	// Seen is what the page the form was rendered with showed of the payment's refunds
	// (PaymentDetail.RefundsSeen). A form whose page the payment's refunds outran (another tab,
	// a second finance user, the shop's API) is refused rather than refunding again what the
	// person meant to refund once. nil: a form rendered before forms carried it (a rolling
	// deploy), judged by the amount alone as before.
	Seen *RefundsSeen
}

// RefundsSeen is what a console page showed of a payment's refunds: what counted against its
// refundable amount (Counted: its refunds but Failed ones, and a waiting refund proposal), how
// many refunds it had (Made, Failed ones too) and which refund proposal waited (Waiting: its
// id, 0 for none). The sum alone was fooled by a refund failing beside a new one of the same
// amount (an outside review: the ticket refunded twice); a new refund or proposal changes the
// count or the id whatever the sums do. A form carries it as "counted.made.waiting".
type RefundsSeen struct {
	Counted int64
	Made    int64
	Waiting int64
}

func (r RefundsSeen) String() string { return fmt.Sprintf("%d.%d.%d", r.Counted, r.Made, r.Waiting) }

// ParseRefundsSeen reads a form's RefundsSeen (RefundsSeen.String).
func ParseRefundsSeen(s string) (RefundsSeen, error) {
	var r RefundsSeen
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return r, Invalid("seen", "the refund form is damaged; reload the page")
	}
	for i, dst := range []*int64{&r.Counted, &r.Made, &r.Waiting} {
		n, err := strconv.ParseInt(parts[i], 10, 64)
		if err != nil || n < 0 {
			return r, Invalid("seen", "the refund form is damaged; reload the page")
		}
		*dst = n
	}
	return r, nil
}

func (in StaffRefundInput) validate() (StaffRefundInput, error) {
	if in.Amount <= 0 || in.Amount >= MaxAmount {
		return in, Invalid("amount", "the amount must be greater than 0")
	}
	if !validUUID(in.IntentKey) {
		return in, Invalid("intent", "the refund form is damaged; reload the page")
	}
	var err error
	in.Reason, err = requiredText("reason", in.Reason, "say why the payment is refunded", MaxReasonLength)
	return in, err
}

// requestKey is the refund core's request key of the form.
func (in StaffRefundInput) requestKey() string { return "console/" + in.IntentKey }

// refundsAsSeen refuses a console refund form (ECONFLICT, field "seen") whose page showed other
// refunds of the payment (seen) than it has now, under the order → session locks of the locked
// session cur: the form was
// filled in for a payment that no longer is (F1 refunded 3.00 for a ticket while F2, in another
// tab, typed the reason for the same 3.00), and its amount was meant for that payment. nothing
// says what did not happen. A form without seen is not judged (an old page: the amount alone).
// Called after the form's replay look-ups, so a form sent again still finds its first outcome.
func refundsAsSeen(ctx context.Context, tx pgx.Tx, cur Session, seen *RefundsSeen, nothing string) error {
	if seen == nil || cur.Status != StatusCompleted {
		return nil // not Completed: refundRoom says so
	}
	committed, waiting, proposal, err := refundTotals(ctx, tx, cur.ID)
	if err != nil {
		return err
	}
	var made int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM refunds WHERE session_id = $1`, cur.ID).Scan(&made); err != nil {
		return fmt.Errorf("refund: count: %w", err)
	}
	if now := committed + waiting; (RefundsSeen{Counted: now, Made: made, Waiting: proposal}) != *seen {
		return &Error{Code: ECONFLICT, Field: "seen", Message: fmt.Sprintf(
			"the payment's refunds changed since you read the page (now %s %s refunded or waiting for approval, %s %s refundable): %s; read the page again",
			FormatMinor(now, cur.Currency), cur.Currency, FormatMinor(max(cur.Amount-now, 0), cur.Currency), cur.Currency, nothing)}
	}
	return nil
}

// RefundDirectLimit is how much of a payment in currency finance may refund without a second
// person (REFUND_DIRECT_LIMIT; 0 when the currency is not configured: every refund needs one).
func (s *Service) RefundDirectLimit(currency string) int64 { return s.cfg.RefundDirectLimit[currency] }

// RequestRefundCode starts support's refund: the amount is checked against the payment now, and
// a one-time code naming it goes to the customer. The same form again while its code is still
// open answers that code and sends nothing.
func (s *Service) RequestRefundCode(ctx context.Context, by Staff, in StaffRefundInput) (Challenge, error) {
	ctx, span := s.startSpan(ctx, "payments.refund.request_code", in.PaymentID, "")
	defer span.End()
	in, err := in.validate()
	if err != nil {
		return Challenge{}, err
	}
	sess, err := s.Get(ctx, in.PaymentID)
	if err != nil {
		return Challenge{}, err
	}
	ctx = s.traceSession(ctx, sess)
	var ch Challenge
	var queued queuedMessage
	err = s.inTx(ctx, "request refund code", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
		if err != nil {
			return err
		}
		// Read once the locks are held: a code lives its CodeTTL from its issue, not from before a
		// wait for them (as tryCode judges one: TestACodeIsJudgedWhenItsLocksAreHeld).
		now := s.cfg.Clock.Now()
		if r, found, err := refundByKey(ctx, tx, cur.ID, in.requestKey()); err != nil || found {
			if err == nil {
				err = Errorf(ECONFLICT, "this refund form was used already: refund %s is %s", Short(r.ID), r.Status)
			}
			return err
		}
		if _, _, err := refundRoom(ctx, tx, cur, in.Amount, true); err != nil {
			return err
		}
		// The same form with another amount (back, another amount typed, sent again) is refused,
		// as finance's is (formReused): a second code for another amount replaced the first and
		// spent one of the payment's code requests (an outside review).
		var asked int64
		err = tx.QueryRow(ctx, `SELECT coalesce(max(amount), 0) FROM cancel_challenges
			WHERE session_id = $1 AND action = 'refund' AND request_key = $2 AND amount <> $3`, cur.ID, in.requestKey(), in.Amount).Scan(&asked)
		if err != nil {
			return fmt.Errorf("request refund code: the form's earlier codes: %w", err)
		}
		if asked != 0 {
			return formReused(asked, in.Amount, cur.Currency)
		}
		if ch, err = openChallengeOf(ctx, tx, cur.ID, CodeRefund, in.requestKey(), in.Amount, now, s.cfg.Notifier != nil); err != nil || ch.ID != "" {
			return err // the form's code is still open: no second message
		}
		if err := refundsAsSeen(ctx, tx, cur, in.Seen, "no code was sent"); err != nil {
			return err
		}
		money := FormatMinor(in.Amount, cur.Currency) + " " + cur.Currency
		ch, queued, err = s.issueCode(ctx, tx, cur, by.Actor(), codeRequest{action: CodeRefund, amount: in.Amount,
			requestKey: in.requestKey(), kind: "refund_code", text: func(code string) string {
				return fmt.Sprintf("Your code to confirm a refund of %s for order %s is %s. %s Read it to the support agent only if you asked for this refund.",
					money, cur.OrderID, code, codeExpiry(s.cfg.CodeTTL))
			}}, now)
		return err
	})
	if err != nil {
		return Challenge{}, err
	}
	if why := s.deliverQueued(ctx, queued); why != "" {
		ch.Undelivered = why // a form's open code (nothing queued) keeps what openChallengeOf read
	}
	return ch, nil
}

// ConfirmRefund spends the customer's code and claims the refund it names, in ONE transaction
// under the order → session locks (a refused claim keeps the code unspent); after commit the
// gateway is asked. The same code again finds the code consumed and the refund its form's key
// made, and creates nothing (Created false).
func (s *Service) ConfirmRefund(ctx context.Context, by Staff, sessionID, challengeID, code string) (RefundResult, error) {
	ctx, span := s.startSpan(ctx, "payments.refund.confirm_code", sessionID, "")
	defer span.End()
	sess, err := s.Get(ctx, sessionID)
	if err != nil {
		return RefundResult{}, err
	}
	ctx = s.traceSession(ctx, sess)
	var res RefundResult
	var wrong error
	var mayHaveCommitted bool
	err = s.withRecheckedRefunds(ctx, sess, func(asked []string) (err error) {
		res, wrong = RefundResult{}, nil
		mayHaveCommitted, err = s.inTxCommit(ctx, "confirm refund", func(tx pgx.Tx) error {
			cur, err := s.lockForRefund(ctx, tx, &sess)
			if err != nil {
				return err
			}
			now := s.cfg.Clock.Now() // after the locks: the code is judged when it is spent (ConfirmCancel)
			try, err := s.tryCode(ctx, tx, sess.ID, challengeID, CodeRefund, code, now, nil, by.Actor())
			if err != nil {
				return err
			}
			if try.Wrong != nil {
				wrong = try.Wrong
				return nil // commit the attempt
			}
			res.Refund, res.Created, err = s.claimRefund(ctx, tx, cur, by.Actor(),
				RefundInput{PaymentID: cur.ID, Amount: try.Challenge.Amount, RequestKey: try.Challenge.RequestKey, besideProposal: true, asked: asked}, now)
			if err != nil || !res.Created {
				return err
			}
			return auditStaff(ctx, tx, by.Actor(), AuditRefundConfirm, cur.ID, fmt.Sprintf("challenge %s: refund %s of %s %s claimed (the gateway is asked after commit)",
				challengeID, res.Refund.ID, FormatMinor(res.Refund.Amount, cur.Currency), cur.Currency), now)
		})
		return err
	})
	if err != nil {
		if res.Refund, err = s.claimedAfterAll(ctx, mayHaveCommitted, res.Refund, err); err != nil {
			return RefundResult{}, err
		}
	}
	if wrong != nil {
		return RefundResult{}, wrong
	}
	res.Refund, err = s.settleRefund(ctx, sess, res.Refund, res.Created)
	return res, err
}

// FinanceRefund is what RefundByFinance did: a refund (Refund), or a proposal waiting for a
// second person (Proposal). Replayed: the form had done it already; nothing new happened.
type FinanceRefund struct {
	Refund   *Refund
	Proposal *Resolution
	Replayed bool
}

// RefundByFinance refunds directly while the payment's refunds, this one included, stay within
// REFUND_DIRECT_LIMIT; above it, it records a four-eyes proposal (audited in the same
// transaction) that a second finance or admin user approves. Both decided under the order →
// session locks, so two concurrent refunds cannot both pass under the limit.
func (s *Service) RefundByFinance(ctx context.Context, by Staff, in StaffRefundInput) (FinanceRefund, error) {
	ctx, span := s.startSpan(ctx, "payments.refund.finance", in.PaymentID, "")
	defer span.End()
	in, err := in.validate()
	if err != nil {
		return FinanceRefund{}, err
	}
	sess, err := s.Get(ctx, in.PaymentID)
	if err != nil {
		return FinanceRefund{}, err
	}
	ctx = s.traceSession(ctx, sess)
	var out FinanceRefund
	var proposal int64
	var mayHaveCommitted bool
	err = s.withRecheckedRefunds(ctx, sess, func(asked []string) (err error) {
		out, proposal = FinanceRefund{}, 0
		now := s.cfg.Clock.Now()
		mayHaveCommitted, err = s.inTxCommit(ctx, "finance refund", func(tx pgx.Tx) error {
			cur, err := s.lockForRefund(ctx, tx, &sess)
			if err != nil {
				return err
			}
			// The form's earlier submission: its refund, or its proposal.
			r, found, err := refundByKey(ctx, tx, cur.ID, in.requestKey())
			if err != nil {
				return err
			}
			if found {
				out = FinanceRefund{Refund: &r, Replayed: true}
				return formReused(r.Amount, in.Amount, cur.Currency)
			}
			var proposed int64
			err = tx.QueryRow(ctx, `SELECT id, refund_amount FROM resolution_proposals WHERE session_id = $1 AND kind = 'refund' AND request_key = $2`,
				cur.ID, in.requestKey()).Scan(&proposal, &proposed)
			if err == nil {
				out.Replayed = true
				return formReused(proposed, in.Amount, cur.Currency)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("finance refund: read proposal: %w", err)
			}
			// Before the room and the limit: a refund and a proposal alike are judged on the
			// payment the form's page showed.
			if err := refundsAsSeen(ctx, tx, cur, in.Seen, "nothing was refunded or proposed"); err != nil {
				return err
			}
			committed, waiting, err := refundRoom(ctx, tx, cur, in.Amount, true)
			if err != nil {
				return err
			}
			if committed+waiting+in.Amount > s.RefundDirectLimit(cur.Currency) {
				proposal, err = proposeRefund(ctx, tx, cur, by, in, now)
				return err
			}
			r, _, err = s.claimRefund(ctx, tx, cur, by.Actor(), RefundInput{PaymentID: cur.ID, Amount: in.Amount, RequestKey: in.requestKey(), besideProposal: true, asked: asked}, now)
			out.Refund = &r
			if err != nil {
				return err
			}
			return auditStaff(ctx, tx, by.Actor(), AuditRefund, cur.ID, fmt.Sprintf("refund %s of %s %s claimed (the gateway is asked after commit): %s",
				r.ID, FormatMinor(in.Amount, cur.Currency), cur.Currency, in.Reason), now)
		})
		return err
	})
	switch {
	case err == nil:
	case proposal != 0 && mayHaveCommitted:
		// The proposal (and its audit entry) may have committed with the answer lost: read back
		// by its id below, as a refund is; not there, the error stands.
		rctx, cancel := s.detachRecord(ctx)
		defer cancel()
		p, gerr := getResolution(rctx, s.db, proposal)
		if gerr != nil || p.SessionID != sess.ID || p.requestKey != in.requestKey() {
			// Not there, or another's under the same id (a failover that lost it and gave the
			// id again: a review): the error stands.
			return FinanceRefund{}, err
		}
		out.Proposal = &p
		return out, nil
	case out.Refund != nil && !out.Replayed:
		r, err := s.claimedAfterAll(ctx, mayHaveCommitted, *out.Refund, err)
		if err != nil {
			return FinanceRefund{}, err
		}
		out.Refund = &r
	default:
		return FinanceRefund{}, err
	}
	if proposal != 0 {
		p, err := getResolution(ctx, s.db, proposal)
		out.Proposal = &p
		return out, err
	}
	if !out.Replayed {
		r, err := s.settleRefund(ctx, sess, *out.Refund, true)
		out.Refund = &r
		return out, err
	}
	return out, nil
}

// formReused refuses a form submitted again with another amount than the first time (its
// intent key already did something else): the person reloads the page for a fresh form.
func formReused(done, asked int64, currency string) error {
	if done == asked {
		return nil
	}
	return Errorf(ECONFLICT, "this refund form was already used for %s %s; reload the page to refund another amount",
		FormatMinor(done, currency), currency)
}

// proposeRefund records a refund proposal for the locked, Completed session cur, audited in the
// same transaction.
func proposeRefund(ctx context.Context, tx pgx.Tx, cur Session, by Staff, in StaffRefundInput, now time.Time) (int64, error) {
	if err := noProposalWaiting(ctx, tx, cur, by, now); err != nil {
		return 0, err
	}
	var id int64
	// refunds_seen: the payment's refunds now, under the order's lock (migration 00980).
	if err := tx.QueryRow(ctx, `INSERT INTO resolution_proposals (kind, session_id, order_id, status_at_proposal, refund_amount, request_key,
			reason, evidence, proposed_by, proposed_at, refunds_seen)
		VALUES ('refund', $1, $2, $3, $4, $5, $6, '', $7, $8, ARRAY(SELECT id FROM refunds WHERE session_id = $1)) RETURNING id`,
		cur.ID, cur.OrderID, string(cur.Status), in.Amount, in.requestKey(), in.Reason, by.Email, now).Scan(&id); err != nil {
		return 0, dbError("propose refund", err, "")
	}
	return id, recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditResolutionPropose, Target: cur.ID,
		Detail: fmt.Sprintf("#%d refund %s %s (above the direct limit): %s", id, FormatMinor(in.Amount, cur.Currency), cur.Currency, in.Reason)}, now)
}

// approveRefund is the approval's effect for a refund proposal p, in ApproveResolution's
// transaction under the order → session locks: the refund claimed with the form's request key
// (the refund core re-checks the payment and the amount received) and bound to the proposal.
func (s *Service) approveRefund(ctx context.Context, tx pgx.Tx, cur Session, p Resolution, by Staff, asked []string, now time.Time) (RefundResult, error) {
	// The shop's API refunds are not held back by a waiting proposal (a person's are, to the room
	// it leaves, and they see why): one made since the proposal may be the very refund it asks
	// for — a proposal of 50.00 and the shop's refund of 50.00 for the same complaint approved a
	// second 50.00 (an outside review, numbers2). The approver decided on the payment as it was:
	// refused, as a settlement whose payment moved is. A refund that failed moved nothing.
	var since int
	var amount int64
	// Since: not among the refunds the proposal saw (migration 00980; read under the order's lock
	// both take, so no clock decides), or after its time for a proposal filed before that.
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(r.amount), 0) FROM refunds r, resolution_proposals p
		WHERE p.id = $4 AND r.session_id = $1 AND r.status <> 'Failed' AND r.created_by LIKE $3
		  AND CASE WHEN p.refunds_seen IS NULL THEN r.created_at > $2 ELSE NOT r.id = ANY(p.refunds_seen) END`,
		cur.ID, p.ProposedAt, string(ActorAPI)+":%", p.ID).Scan(&since, &amount); err != nil {
		return RefundResult{}, dbError("approve refund: the shop's refunds since the proposal", err, "")
	}
	if since > 0 {
		return RefundResult{}, Errorf(ECONFLICT, "the shop refunded %s of payment %s through the API since the proposal (%d refund(s)): the customer may have this money already; reject the proposal, and propose again if a refund is still owed",
			FormatMinor(amount, cur.Currency)+" "+cur.Currency, Short(cur.ID), since)
	}
	r, created, err := s.claimRefund(ctx, tx, cur, by.Actor(), RefundInput{PaymentID: cur.ID, Amount: p.RefundAmount, RequestKey: p.requestKey, asked: asked}, now)
	if err != nil {
		return RefundResult{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE resolution_proposals SET refund_id = $2 WHERE id = $1`, p.ID, r.ID); err != nil {
		return RefundResult{}, fmt.Errorf("approve refund: bind: %w", err)
	}
	return RefundResult{Refund: r, Created: created}, nil
}
