package payments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// CaseRefundUnsettled: a Pending refund's schedule ran out without a final answer from the gateway.
const CaseRefundUnsettled = "refund_unsettled"

// Refund statuses (contract: Pending | Succeeded | Failed).
const (
	RefundPending   = "Pending"
	RefundSucceeded = "Succeeded"
	RefundFailed    = "Failed"
)

// Refund is a refund of (part of) a Completed payment.
type Refund struct {
	ID              string
	PaymentID       string
	OrderID         string
	Amount          int64
	Currency        string
	Status          string
	GatewayRefundID string
	Detail          string
	CreatedBy       string // who asked: "<actor kind>:<id>"
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// FlaggedAt is set when the patrol's schedule ran out with the refund still Pending: a case
	// for finance is open, and the patrol asks no more.
	FlaggedAt  *time.Time
	FlagReason string
}

// FailedByHand says the refund was settled Failed by four eyes (failedByHand): the gateway may
// still pay it, and then only people correct it to Succeeded (ProposeRefundOutcome).
func (r Refund) FailedByHand() bool {
	return r.Status == RefundFailed && strings.HasPrefix(r.Detail, "settled by hand:")
}

// SettleableByHand says finance may propose r's outcome: a Pending refund the patrol gave up on
// (flagged), or one settled Failed by hand that the gateway paid after all (to Succeeded only).
func (r Refund) SettleableByHand() bool {
	return r.Status == RefundPending && r.FlaggedAt != nil || r.FailedByHand()
}

const refundColumns = `id::text, session_id::text, order_id, amount, currency, status,
	coalesce(gateway_refund_id, ''), detail, created_by, created_at, updated_at, flagged_at, coalesce(flag_reason, '')`

func scanRefund(row pgx.Row) (Refund, error) {
	var r Refund
	err := row.Scan(&r.ID, &r.PaymentID, &r.OrderID, &r.Amount, &r.Currency, &r.Status,
		&r.GatewayRefundID, &r.Detail, &r.CreatedBy, &r.CreatedAt, &r.UpdatedAt, &r.FlaggedAt, &r.FlagReason)
	return r, err
}

// GetRefund returns one refund.
func (s *Service) GetRefund(ctx context.Context, id string) (Refund, error) {
	if !validUUID(id) {
		return Refund{}, Errorf(ENOTFOUND, "refund %q not found", id)
	}
	r, err := scanRefund(s.db.QueryRow(ctx, `SELECT `+refundColumns+` FROM refunds WHERE id = $1`, id))
	if err != nil {
		return Refund{}, dbError("get refund", err, "refund %q not found", id)
	}
	return r, nil
}

// MaxRefundsListed bounds RefundsOf: a payment's refunds oldest first, at most this many.
const MaxRefundsListed = 1000

// RefundsOf returns the refunds of a payment, oldest first (at most MaxRefundsListed; more:
// true when there are others after them); ENOTFOUND when there is no such payment.
func (s *Service) RefundsOf(ctx context.Context, paymentID string) (refunds []Refund, more bool, err error) {
	if _, err := s.Get(ctx, paymentID); err != nil {
		return nil, false, err
	}
	if refunds, err = listRefunds(ctx, s.db, paymentID, MaxRefundsListed+1); err != nil {
		return nil, false, err
	}
	if len(refunds) > MaxRefundsListed {
		return refunds[:MaxRefundsListed], true, nil
	}
	return refunds, false, nil
}

// listRefunds reads up to limit refunds of a session, oldest first.
func listRefunds(ctx context.Context, q querier, sessionID string, limit int) ([]Refund, error) {
	rows, err := q.Query(ctx, `SELECT `+refundColumns+` FROM refunds WHERE session_id = $1 ORDER BY created_at, refunds.id LIMIT $2`, sessionID, limit)
	if err != nil {
		return nil, fmt.Errorf("refunds of %s: %w", sessionID, err)
	}
	refunds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Refund, error) { return scanRefund(r) })
	if err != nil {
		return nil, fmt.Errorf("refunds of %s: %w", sessionID, err)
	}
	return refunds, nil
}

// RefundInput asks for a refund. RequestKey identifies the request (an API idempotency key or a
// derived intent, scoped by the caller): the same key again returns the refund it created.
type RefundInput struct {
	PaymentID  string
	Amount     int64
	RequestKey string
	// besideProposal: a person's refund from the console, which counts a refund proposal still
	// waiting for approval as taken (refundRoom). The API's refunds and the approval of that very
	// proposal do not.
	besideProposal bool
	// asked: the refunds settled Failed by hand that recheckRefundsFailedByHand asked the gateway
	// about before this claim (withRecheckedRefunds); any other is a reason to ask again.
	asked []string
	// Bind: the caller's intent key (Slot.Binding), completed with the refund in the claim's
	// transaction: from that commit on, an identical keyless refund replays this refund (202
	// while it is Pending) instead of being told its first request still runs (409) for as long
	// as the gateway takes.
	Bind *KeyBinding
}

// RefundResult is a refund and whether this call created it.
type RefundResult struct {
	Refund  Refund
	Created bool
}

// CreateRefund refunds part or all of a Completed payment, with the same shape as Create: a
// short transaction under the order → session locks checks that the payment is Completed and
// that the refunds (all but Failed ones) stay within the amount received, and inserts a Pending
// refund; after commit the gateway is asked with the refund's id as the idempotency key; the
// answer is applied in another short transaction that writes the RefundIssued ledger entry
// exactly once. No answer leaves it Pending for the patrol (after RegisterGrace, so it never
// races this request), which asks again on the sweeper's schedule without ever refunding twice
// (askRefund) and flags the refund for finance when the schedule runs out.
func (s *Service) CreateRefund(ctx context.Context, actor Actor, in RefundInput) (RefundResult, error) {
	if in.Amount <= 0 || in.Amount >= MaxAmount {
		return RefundResult{}, Invalid("amount", "amount must be an integer in minor units, greater than 0 and less than 10^12")
	}
	if in.RequestKey == "" {
		in.RequestKey = uuid.NewString()
	}
	ctx, span := s.startSpan(ctx, "payments.refund", in.PaymentID, "")
	defer span.End()
	sess, err := s.Get(ctx, in.PaymentID)
	if err != nil {
		return RefundResult{}, err
	}
	ctx = s.traceSession(ctx, sess)
	var out Refund
	var created, mayHaveCommitted bool
	err = s.withRecheckedRefunds(ctx, sess, func(asked []string) (err error) {
		in.asked = asked
		out, created = Refund{}, false
		now := s.cfg.Clock.Now()
		mayHaveCommitted, err = s.inTxCommit(ctx, "refund: claim", func(tx pgx.Tx) error {
			cur, err := s.lockForRefund(ctx, tx, &sess)
			if err != nil {
				return err
			}
			out, created, err = s.claimRefund(ctx, tx, cur, actor, in, now)
			if err != nil || in.Bind == nil {
				return err
			}
			return in.Bind.exec(ctx, tx, out.ID, now)
		})
		return err
	})
	if err != nil {
		if !created {
			// A refund found by its key (an identical request made it): finding it again proves
			// nothing of this transaction, the key's binding included (a review). The same
			// request again replays it.
			return RefundResult{}, err
		}
		if out, err = s.claimedAfterAll(ctx, mayHaveCommitted, out, err); err != nil {
			return RefundResult{}, err
		}
	}
	in.Bind.committed()
	if out, err = s.settleRefund(ctx, sess, out, created); err != nil {
		return RefundResult{}, err
	}
	return RefundResult{Refund: out, Created: created}, nil
}

// claimedAfterAll reads back a refund claim whose transaction failed (err) with its COMMIT's
// answer lost (mayHaveCommitted: a failover, pgbouncer's FATAL, a connection cut): r, the refund
// it claimed, found by its id means the transaction committed, and the request goes on as if the
// answer had come — the one that made the refund asks the gateway now. It answered 503 (the
// console: an error page, audited "outcome unknown") for a refund that was made, which the
// gateway heard of only from the patrol after its grace, and the same request sent again was told
// the refund had been "sent" (a re-read of session 52). Not found, or not readable: err stands.
func (s *Service) claimedAfterAll(ctx context.Context, mayHaveCommitted bool, r Refund, err error) (Refund, error) {
	if !mayHaveCommitted || r.ID == "" {
		return Refund{}, err
	}
	rctx, cancel := s.detachRecord(ctx)
	defer cancel()
	got, gerr := s.GetRefund(rctx, r.ID)
	if gerr != nil {
		return Refund{}, err
	}
	if derr := s.confirmDurable(rctx); derr != nil { // as sessionClaimedAfterAll
		s.log.Warn("refund: the claim's COMMIT answer was lost; the claim is there, but not known to be on the standbys: not sent", "refund", got.ID, "err", derr)
		return Refund{}, err
	}
	s.log.Warn("refund: the claim's COMMIT answer was lost, and the claim is there: going on with it", "refund", got.ID, "err", err)
	return got, nil
}

// recheckRefundsFailedByHand asks the gateway again, before a new refund of the payment, about
// each of its refunds that finance settled Failed by hand (a four-eyes outcome): settling Failed
// frees its amount for another refund, and a refund the gateway still completes after that (days
// late) plus the new one would give the customer more than the ledger shows, within what the
// gateway's own captured-amount check allows. A refund the gateway knows by id is read by it;
// one whose id the gateway never gave (its answer was lost) is looked for by our key
// (FindRefund, making nothing: Stripe searches the payment's refunds), and a gateway that cannot
// search (the reference gateway: "unsupported") leaves it unasked, since asking by sending it
// again would make it. A refund the gateway says succeeded (or still pending) refuses the new one
// (409), keeps the gateway's id on the row and is noted on the payment's gateway_mismatch case
// for finance; the gateway not answering refuses it too (503: the new refund would need the
// gateway anyway).
//
// It returns the ids of the refunds it looked at (asked): the claim that follows, under the
// order → session locks, is refused with errSettledMeanwhile when another refund was settled
// Failed by hand since (claimRefund), and withRecheckedRefunds asks again.
func (s *Service) recheckRefundsFailedByHand(ctx context.Context, sess Session) (asked []string, err error) {
	rows, err := s.db.Query(ctx, `SELECT `+refundColumns+` FROM refunds WHERE session_id = $1 AND `+failedByHand, sess.ID)
	if err != nil {
		return nil, dbError("refund: refunds settled by hand", err, "")
	}
	failed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Refund, error) { return scanRefund(r) })
	if err != nil {
		return nil, dbError("refund: refunds settled by hand", err, "")
	}
	for _, r := range failed {
		started := time.Now()
		var gr GatewayRefund
		found := true
		if r.GatewayRefundID != "" {
			gr, err = s.gwOf(sess).RefundStatus(ctx, r.GatewayRefundID)
			s.logGatewayCall(ctx, sess.ID, "refund_status", r.ID, started, err)
		} else {
			gr, found, err = s.gwOf(sess).FindRefund(ctx, sess.GatewayPaymentID, r.ID)
			s.logGatewayCall(ctx, sess.ID, "find_refund", r.ID, started, err)
			if GatewayErrorCode(err) == "unsupported" {
				found, err = false, nil
			}
		}
		if err != nil {
			return nil, &Error{Code: EUNAVAIL, RetryAfter: 30 * time.Second, Message: fmt.Sprintf(
				"refund %s was settled Failed by hand and the gateway could not be asked about it again before a new refund: %v", Short(r.ID), err)}
		}
		// An answer about another refund (another payment, id, currency or amount, or a gateway
		// refund another of ours holds) is no word about this one: its "failed" freed the
		// amount, and a new refund went out beside the one the gateway had paid; its
		// "succeeded" kept another refund's id on this one (reviews of gateway answers;
		// driveRefund refuses the same answers).
		mismatch := ""
		if found {
			if mismatch, err = refundAnswerAbout(ctx, s.db, sess, r, gr); err != nil {
				return nil, err
			}
		}
		if !found || (gr.Status == "failed" && mismatch == "") {
			asked = append(asked, r.ID)
			continue
		}
		var said string
		nctx, done := s.detachRecord(ctx)
		defer done()
		if err := s.inTx(nctx, "refund: note", func(tx pgx.Tx) error {
			// Kept, so the next refund reads it by id (and the payment page shows it); not the
			// id of an answer about another refund — asked again under the locks a writer of a
			// gateway refund's id takes: read outside them, an apply booking the same gateway
			// refund for another payment meanwhile was missed, and finance was told to book it
			// here too (a review).
			about := mismatch
			if about == "" && gr.ID != "" {
				if _, err := lockOrderAndSession(nctx, tx, sess.OrderID, sess.ID); err != nil {
					return err
				}
				if err := lockGatewayRefund(nctx, tx, sess, gr.ID); err != nil {
					return err
				}
				var err error
				if about, err = refundAnswerAbout(nctx, tx, sess, r, gr); err != nil {
					return err
				}
				if about == "" {
					if _, err := tx.Exec(nctx, `UPDATE refunds SET gateway_refund_id = $2 WHERE id = $1 AND gateway_refund_id IS NULL`, r.ID, gr.ID); err != nil {
						return dbError("refund: note the gateway's id", err, "")
					}
				}
			}
			detail := fmt.Sprintf("refund %s was settled Failed by hand (%s), but the gateway says %s for %s: its amount is not free for another refund",
				r.ID, r.Detail, gr.Status, gr.ID)
			said = "says " + gr.Status
			if about != "" {
				detail = fmt.Sprintf("refund %s was settled Failed by hand (%s); asked about it again before another refund: %s", r.ID, r.Detail, about)
				said = "answers about another refund"
			}
			return noteCase(nctx, tx, sess.ID, sess.OrderID, CaseGatewayMismatch, detail, s.cfg.Clock.Now(), refundFact(r.ID, r.Status, gr))
		}); err != nil {
			return nil, err
		}
		// Refused until people settle it: finance corrects it to Succeeded (four eyes: the
		// ledger gets its RefundIssued entry, and what is left is refundable), or the gateway
		// says failed after all. The case may be resolved already (the same news is not
		// opened twice), so the refusal says what to do, not where a case is.
		if said == "answers about another refund" {
			// Not "mark it Succeeded": the answer is no word that this refund was paid, and
			// booked, it was the other refund's money twice (a review).
			return nil, Errorf(ECONFLICT, "refund %s was settled Failed by hand, and asked about it again the gateway answers about another refund: nothing new is refunded until finance learns from the gateway what became of it (the gateway_mismatch case on the payment's page)", Short(r.ID))
		}
		return nil, Errorf(ECONFLICT, "refund %s was settled Failed by hand, but the gateway %s: nothing new is refunded until finance marks it Succeeded on the payment's page (Settle by hand, approved by a second person)", Short(r.ID), said)
	}
	return asked, nil
}

// failedByHand selects a payment's refunds settled Failed by hand: the ones
// recheckRefundsFailedByHand asks about.
const failedByHand = `status = 'Failed' AND detail LIKE 'settled by hand:%'`

// errSettledMeanwhile refuses a refund claim when a refund of the payment was settled Failed by
// hand (an approval committed) after the claim's re-check read its list and before the claim
// took the locks: that refund's amount looks free, and nobody asked the gateway whether it paid
// it after all. withRecheckedRefunds asks again; it reaches the caller only when that keeps
// happening.
var errSettledMeanwhile = &Error{Code: ECONFLICT, Message: "a refund of this payment was settled Failed by hand while this one was being checked: try again"}

// withRecheckedRefunds runs claim — the transaction of a path that refunds, which claims through
// claimRefund with the ids asked — after recheckRefundsFailedByHand, and once more after asking
// again when a refund was settled Failed by hand between the two (errSettledMeanwhile). The
// re-check runs outside the locks (it waits for the gateway), so without the claim's look under
// them an approval committing in that gap freed an amount nobody asked the gateway about.
//
// A Completed payment without its gateway id (settled by hand before the gateway's answer was
// recorded) is checked first: the Check finds the payment at the gateway by its reference and
// records its id, which the claim's locked session then carries to the gateway (refundRoom
// refuses a refund without it).
func (s *Service) withRecheckedRefunds(ctx context.Context, sess Session, claim func(asked []string) error) error {
	if sess.Status == StatusCompleted && sess.GatewayPaymentID == "" {
		var err error
		if sess, err = s.lookUpGatewayID(ctx, sess); err != nil {
			return err
		}
	}
	for attempt := 1; ; attempt++ {
		asked, err := s.recheckRefundsFailedByHand(ctx, sess)
		if err != nil {
			return err
		}
		if err = claim(asked); !errors.Is(err, errSettledMeanwhile) || attempt == 3 {
			return err
		}
	}
}

// lookUpGatewayID checks sess, a payment settled Completed by hand before its gateway payment id
// was recorded: the Check finds the payment at the gateway by its reference and records its id.
// It returns the session as the Check left it, or, when still without an id, the refusal
// (withoutGatewayID). The refund paths' one way to it (claims and the patrol's drive).
func (s *Service) lookUpGatewayID(ctx context.Context, sess Session) (Session, error) {
	cur, err := s.Check(ctx, Actor{Kind: ActorSystem, ID: "refund"}, sess.ID)
	if err != nil {
		return sess, err
	}
	if cur.GatewayPaymentID == "" {
		return cur, s.withoutGatewayID(ctx, cur)
	}
	return cur, nil
}

// withoutGatewayID is the refusal of a refund of sess, a payment settled Completed by hand whose
// Check found no gateway payment id to record: the gateway has no payment under its reference,
// or the one it has contradicts ours (another amount or currency: a gateway_mismatch case, and
// checking again finds the same). Nothing is sent either way.
func (s *Service) withoutGatewayID(ctx context.Context, sess Session) error {
	var mismatch bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL)`,
		sess.ID, CaseGatewayMismatch).Scan(&mismatch); err != nil {
		return dbError("refund: cases", err, "")
	}
	if mismatch {
		return Errorf(ECONFLICT, "payment %s was settled by hand before its gateway payment id was known, and the gateway's payment under its reference contradicts it (its gateway_mismatch case says how): nothing was refunded", Short(sess.ID))
	}
	return Errorf(ECONFLICT, "payment %s was settled by hand before its gateway payment id was known, and the gateway has no payment under its reference: nothing was refunded; refund it at the gateway by hand", Short(sess.ID))
}

// settledMeanwhile is claimRefund's look under the locks: errSettledMeanwhile when a refund of
// the session is settled Failed by hand and not among those asked.
func settledMeanwhile(ctx context.Context, tx pgx.Tx, sessionID string, asked []string) error {
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM refunds WHERE session_id = $1 AND `+failedByHand+`
		AND NOT (id::text = ANY($2::text[]))`, sessionID, asked).Scan(&n); err != nil {
		return fmt.Errorf("refund: refunds settled by hand: %w", err)
	}
	if n > 0 {
		return errSettledMeanwhile
	}
	return nil
}

// lockForRefund takes the order → session locks for a refund's claim and makes *sess the
// payment as locked: the refund goes to the gateway with it, not with the payment as read before
// (TestRefundGoesOutWithThePaymentAsLocked).
func (s *Service) lockForRefund(ctx context.Context, tx pgx.Tx, sess *Session) (Session, error) {
	cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
	if err != nil {
		return Session{}, err
	}
	*sess = cur
	if h := s.cfg.Hooks.AfterRefundLock; h != nil {
		h(ctx, cur.ID)
	}
	return cur, nil
}

// claimRefund is the claim of a refund, in the caller's transaction under the order → session
// locks (cur is the locked session): the refund the request key made already, or a new Pending
// one when the payment is Completed and its refunds (all but Failed ones) stay within the amount
// received. created reports a new one. Every path that refunds (the API, the console's code-
// confirmed and direct refunds, an approved four-eyes proposal) claims through here.
func (s *Service) claimRefund(ctx context.Context, tx pgx.Tx, cur Session, actor Actor, in RefundInput, now time.Time) (r Refund, created bool, err error) {
	existing, found, err := refundByKey(ctx, tx, cur.ID, in.RequestKey)
	if err != nil {
		return Refund{}, false, err
	}
	if found {
		if existing.Amount != in.Amount {
			return Refund{}, false, Errorf(ECONFLICT, "this request already refunded %d, not %d", existing.Amount, in.Amount)
		}
		return existing, false, nil
	}
	if err := settledMeanwhile(ctx, tx, cur.ID, in.asked); err != nil {
		return Refund{}, false, err
	}
	if _, _, err := refundRoom(ctx, tx, cur, in.Amount, in.besideProposal); err != nil {
		return Refund{}, false, err
	}
	// The refund and its first event (the feed's, migration 00212) in one statement.
	r, err = scanRefund(tx.QueryRow(ctx, `WITH r AS (
			INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key,
				next_check_at, created_by, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, 'Pending', $6, $7, $8, $9, $9) RETURNING *
		), e AS (
			INSERT INTO refund_events (refund_id, to_status, actor_kind, actor_id, created_at) SELECT id, status, $10, $11, created_at FROM r
		)
		SELECT `+refundColumns+` FROM r`,
		uuid.NewString(), cur.ID, cur.OrderID, in.Amount, cur.Currency, in.RequestKey, now.Add(s.cfg.RegisterGrace),
		string(actor.Kind)+":"+actor.ID, now, string(actor.Kind), actor.ID))
	if err != nil {
		return Refund{}, false, dbError("refund: insert", err, "")
	}
	return r, true, nil
}

// refundByKey reads the refund a request key made, if any.
func refundByKey(ctx context.Context, q querier, sessionID, key string) (Refund, bool, error) {
	r, err := scanRefund(q.QueryRow(ctx, `SELECT `+refundColumns+` FROM refunds WHERE session_id = $1 AND request_key = $2`, sessionID, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Refund{}, false, nil
	}
	if err != nil {
		return Refund{}, false, fmt.Errorf("refund: read: %w", err)
	}
	return r, true, nil
}

// refundRoom says whether amount may be refunded from the locked session cur now: it is
// Completed and its refunds stay within the amount received (ECONFLICT otherwise). It returns
// what the refunds have taken or hold (committed) and what a refund proposal still waiting for a
// second person asks for (waiting; at most one proposal waits per payment).
//
// withWaiting counts the waiting proposal as taken: a refund a person starts from the console (a
// support code, a finance refund or proposal) may not promise money a four-eyes proposal already
// asks for, so the proposal's approval cannot be refused later for money given away while it
// waited. The API's refunds (the shop's own system) and the proposal's approval do not count it.
func refundRoom(ctx context.Context, tx pgx.Tx, cur Session, amount int64, withWaiting bool) (committed, waiting int64, err error) {
	switch {
	case cur.Status != StatusCompleted:
		return 0, 0, Errorf(ECONFLICT, "only a Completed payment can be refunded; this one is %s", cur.Status)
	case cur.GatewayPaymentID == "":
		// Settled Completed by hand (four eyes) before the gateway's answer with its id was
		// recorded: a refund sent for no payment was refused (not_found) and failed, the
		// customer refunded nothing, finance told the gateway's books differ (an outside review).
		// A Check finds the payment at the gateway by its reference and records its id (the
		// claiming paths check first: withRecheckedRefunds).
		return 0, 0, Errorf(ECONFLICT, "payment %s was settled by hand before its gateway payment id was known, and the gateway has not been found holding it under its reference: check it (the check looks it up), then refund", Short(cur.ID))
	}
	committed, waiting, proposal, err := refundTotals(ctx, tx, cur.ID)
	if err != nil {
		return 0, 0, err
	}
	switch {
	case committed+amount > cur.Amount:
		return committed, waiting, Errorf(ECONFLICT, "refunds would exceed the amount received: %s of %s %s already refunded or pending",
			FormatMinor(committed, cur.Currency), FormatMinor(cur.Amount, cur.Currency), cur.Currency)
	case withWaiting && committed+waiting+amount > cur.Amount:
		return committed, waiting, Errorf(ECONFLICT, "refunds would exceed the amount received: %s of %s %s already refunded or pending, and refund proposal #%d asks for %s more and waits for approval; approve or reject it first",
			FormatMinor(committed, cur.Currency), FormatMinor(cur.Amount, cur.Currency), cur.Currency, proposal, FormatMinor(waiting, cur.Currency))
	}
	return committed, waiting, nil
}

// refundTotals reads what the refunds of session id have taken or hold (committed: every refund
// but a Failed one) and the refund proposal still waiting for a second person (its amount and
// id; 0 when none waits). PaymentDetail.RefundsCounted is the same sum as the console page reads
// it.
func refundTotals(ctx context.Context, tx pgx.Tx, id string) (committed, waiting, proposal int64, err error) {
	if err := tx.QueryRow(ctx, `SELECT (SELECT coalesce(sum(amount), 0) FROM refunds WHERE session_id = $1 AND status <> 'Failed'),
			coalesce(p.refund_amount, 0), coalesce(p.id, 0)
		FROM (SELECT) AS one LEFT JOIN resolution_proposals p ON p.session_id = $1 AND p.kind = 'refund' AND p.state = 'proposed'`,
		id).Scan(&committed, &waiting, &proposal); err != nil {
		return 0, 0, 0, fmt.Errorf("refund: sum: %w", err)
	}
	return committed, waiting, proposal, nil
}

// settleRefund asks the gateway about a refund just claimed (still Pending) and applies the
// answer. No answer is not an error: the refund stays Pending for the patrol, and is returned as
// the database has it.
//
// Only the request that created the refund (created) asks, and it asks without a lease: the
// refund is new, due for the patrol only after RegisterGrace, and neither flagged nor proposed
// for, so nothing else drives it meanwhile — a send late after the claim holds it first, and
// leaves it to the patrol should the patrol have taken it up meanwhile (holdLateSend). A request that found the refund an earlier one made
// (a key taken over, a code form sent again) returns it as stored: the request that made it, or
// the patrol under its lease, settles it. Driving it here too would be a second, unleased
// drive beside the patrol's, a retry or an approval by hand — and once the gateway may have
// forgotten the key (Stripe: 24 hours), two drives that both find nothing both send.
func (s *Service) settleRefund(ctx context.Context, sess Session, r Refund, created bool) (Refund, error) {
	if r.Status != RefundPending || !created {
		return r, nil
	}
	if !s.sendFitsGrace(r.CreatedAt) {
		s.log.Warn("refund: the claim committed too late to ask the gateway before the patrol may; leaving it to the patrol",
			"refund", r.ID, "claimed", r.CreatedAt)
		return r, nil
	}
	if s.cfg.Clock.Now().Sub(r.CreatedAt) > lateSend {
		// Due RegisterGrace after its claim, less than that after this send: held RegisterGrace
		// past it first, as a late Create's session is (holdLateSend).
		if err := s.holdLateSend(ctx, lateRefund(r), r.ID, r.CreatedAt); err != nil {
			s.log.Warn("refund: could not hold the refund for a late send; leaving it to the patrol", "refund", r.ID, "err", err)
			gctx, done := s.detachRecord(ctx)
			defer done()
			if cur, gerr := s.GetRefund(gctx, r.ID); gerr == nil {
				return cur, nil
			}
			return r, nil
		}
	}
	out, err := s.driveRefund(ctx, sess, r)
	if err != nil {
		s.log.Info("refund not settled yet", "refund", r.ID, "err", err)
		gctx, done := s.detachRecord(ctx)
		defer done()
		return s.GetRefund(gctx, r.ID)
	}
	return out, nil
}

// askRefund learns what the gateway did with refund r, asking in a way that can never refund
// twice: a refund the gateway named is read by its id; one whose answer was lost is asked again
// with the same key while the gateway still honours keys, and looked up by that key (FindRefund)
// once it may have forgotten it (KeyRetention: Stripe keeps keys 24 hours) — only when the
// lookup finds nothing is the refund asked for again. sent reports whether the answer came from
// a refund request (whose refusal means the refund failed) rather than from a look-up.
func (s *Service) askRefund(ctx context.Context, sess Session, r Refund) (gr GatewayRefund, sent bool, err error) {
	if r.GatewayRefundID != "" {
		started := time.Now()
		gr, err = s.gwOf(sess).RefundStatus(ctx, r.GatewayRefundID)
		s.logGatewayCall(ctx, sess.ID, "refund_status", r.ID, started, err)
		return gr, false, err
	}
	if ret := s.gw.KeyRetention(); ret > 0 && !s.cfg.Clock.Now().Before(r.CreatedAt.Add(ret-min(ret/10, time.Hour))) {
		started := time.Now()
		var found bool
		gr, found, err = s.gwOf(sess).FindRefund(ctx, sess.GatewayPaymentID, r.ID)
		s.logGatewayCall(ctx, sess.ID, "find_refund", r.ID, started, err)
		if err != nil || found {
			return gr, false, err
		}
		// Nothing was made with our key: asking again cannot refund twice.
	}
	if token, leased := leaseOf(ctx, r.ID); leased {
		// Still leased, and still Pending: a refund settled meanwhile is never sent again. The
		// lease is held RegisterGrace past the send, from the time read once the row is locked
		// (holdForSend's rule for sessions): it ran out a lease after a send late in the drive
		// (a look-up by key took most of it), and the next replica, finding nothing by key yet,
		// sent the refund again (two refunds past the gateway's key retention, a review).
		if err := s.holdLeaseForSend(ctx, refundLeases, r.ID, token, `t.status = 'Pending'`); err != nil {
			return gr, false, err
		}
	}
	started, sentAt := time.Now(), s.cfg.Clock.Now()
	gr, err = s.gwOf(sess).Refund(ctx, sess.GatewayPaymentID, r.ID, r.Amount, sess.Currency)
	s.logGatewayCall(ctx, sess.ID, "refund", r.ID, started, err)
	if mayBeInFlight(err) {
		// Sent and not answered: not looked at again before it can no longer be in flight (as
		// registerAgain's hold). The next look came at the schedule's step (10 s after a long
		// outage or finance's Retry), found nothing by key yet and sent it again (a review).
		hctx, done := s.detachRecord(ctx)
		defer done()
		if _, herr := s.execBounded(hctx, "refund: hold for a send in flight", `UPDATE refunds SET next_check_at = greatest(next_check_at, $2)
			WHERE id = $1 AND status = 'Pending' AND flagged_at IS NULL`, r.ID, sentAt.Add(s.cfg.RegisterGrace)); herr != nil {
			s.log.Warn("refund: could not hold a refund whose request may be in flight", "refund", r.ID, "err", herr)
		}
	}
	return gr, true, err
}

// refundFact is a refund's contradiction as a case's fact: the refund, how it stands here, and
// the gateway's answer about it (any of them changing is new news). Without facts a case finance
// resolved was opened again at the patrol's every look at a refund still Pending behind a
// misstated answer (an outside review).
func refundFact(refundID, here string, gr GatewayRefund) string {
	return fmt.Sprintf("refund %s (%s here): %s (%s, %d of %s)", refundID, here, orNone(gr.ID), gr.Status, gr.Amount, orNone(gr.PaymentID))
}

// refundFactGatewayRefunds are the gateway refund ids the cases of session sessionID name in a
// refundFact of refund refundID (the gateway's answers about it, kept on its row or not).
func refundFactGatewayRefunds(ctx context.Context, q querier, sessionID, refundID string) ([]string, error) {
	var ids []string
	if err := q.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT split_part(split_part(f, '): ', 2), ' (', 1)), '{}')
		FROM finance_cases, unnest(facts) f WHERE session_id = $1 AND kind = $2 AND f LIKE 'refund ' || $3 || ' (%'`,
		sessionID, CaseGatewayMismatch, refundID).Scan(&ids); err != nil {
		return nil, dbError("refund: the gateway's answers about it", err, "")
	}
	return slices.DeleteFunc(ids, func(id string) bool { return id == "" || id == "(none)" }), nil
}

// refundFactHolder names a refund other than refundID, at the session's gateway, whose gateway
// refund a refundFact of refundID on the session's cases names ("" when none): matched whole
// inside the fact, so an id the parse (refundFactGatewayRefunds) would cut — one holding " (" —
// is still found (a review).
func refundFactHolder(ctx context.Context, q querier, sessionID, refundID string) (string, error) {
	var other string
	if err := q.QueryRow(ctx, `SELECT coalesce(min(o.id::text), '') FROM refunds o JOIN payment_sessions ps ON ps.id = o.session_id
		WHERE o.gateway_refund_id IS NOT NULL AND o.id <> $3 AND ps.gateway = (SELECT gateway FROM payment_sessions WHERE id = $1)
		  AND EXISTS (SELECT FROM finance_cases fc, unnest(fc.facts) f WHERE fc.session_id = $1 AND fc.kind = $2
			AND f LIKE 'refund ' || $3 || ' (%' AND strpos(f, '): ' || o.gateway_refund_id || ' (') > 0)`,
		sessionID, CaseGatewayMismatch, refundID).Scan(&other); err != nil {
		return "", dbError("refund: whose gateway refund", err, "")
	}
	return other, nil
}

// driveRefund asks the gateway about a refund (askRefund) and applies the answer: succeeded
// writes the one RefundIssued entry; a refusal of the refund request fails it; pending records
// the gateway's refund id (so the next look reads it instead of asking again).
func (s *Service) driveRefund(ctx context.Context, sess Session, r Refund) (Refund, error) {
	ctx, span := s.startSpan(ctx, "payments.refund.drive", sess.ID, sess.OrderID)
	defer span.End()
	if sess.GatewayPaymentID == "" {
		// A refund of a payment settled by hand before its gateway id was recorded, claimed
		// before claims looked it up (withRecheckedRefunds): sent for payment "", it was refused
		// not_found and failed (a review). The Check finds the payment by its reference; until it
		// does, nothing is sent and the refund waits for its next look (flagged in the end).
		cur, err := s.lookUpGatewayID(ctx, sess)
		if err != nil {
			return r, err
		}
		sess = cur
		// The Check handed the drive's patrol slot back (its last gateway call, as it is for a
		// drive of a session): the refund's own call waits for one again, or the patrol would
		// talk to the gateway wider than SweepConcurrency (a review).
		if err := retakeSlot(ctx); err != nil {
			return r, err
		}
	}
	gr, sent, gerr := s.askRefund(ctx, sess, r)
	status := ""
	detail := ""
	mismatch := ""
	booksDiffer := "" // a refusal that contradicts our books: the refund fails, and finance gets a case
	if gerr == nil {
		mismatch = refundAnswerMismatch(sess, r, gr) // gateway_answer.go
	}
	switch {
	case mismatch != "":
		// never applied: it stays Pending and finance gets a gateway_mismatch case
	case gerr == nil && gr.Status == "succeeded":
		status = RefundSucceeded
	case gerr == nil && gr.Status == "failed":
		status, detail = RefundFailed, "the gateway reports the refund failed"
	case gerr == nil:
		// pending at the gateway: ask again later
	case sent && FailureOf(gerr) == FailureDefinitive:
		status, detail = RefundFailed, "the gateway refused: "+GatewayErrorCode(gerr)
		if c := GatewayErrorCode(gerr); c == "amount_exceeds_remaining" || c == "not_refundable" || c == "not_found" {
			// Only a Completed payment with room for the refund reaches the gateway (the
			// claim's check, and the schema's backstop): a gateway that says the payment took
			// no money, or that less of it remains, keeps other books than ours — a refund made
			// elsewhere (its dashboard), one whose answer we lost and failed by hand, a
			// capture smaller than recorded. So does one that does not know the payment at all
			// (Stripe's 404 resource_missing: another account's key, a wiped test mode). The
			// refund failed; finance must see why.
			booksDiffer = fmt.Sprintf("refund %s of %d %s was refused by the gateway as %s, while %s is %s here with the refund within what remains: the gateway's books differ",
				r.ID, r.Amount, sess.Currency, c, sess.ID, sess.Status)
		}
	default:
		return r, gerr
	}
	ctx, done := s.detachRecord(ctx)
	defer done()
	now := s.cfg.Clock.Now()
	var out Refund
	leaseLost := false
	err := s.inTx(ctx, "refund: apply", func(tx pgx.Tx) error {
		if _, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID); err != nil {
			return err
		}
		cur, err := scanRefund(tx.QueryRow(ctx, `SELECT `+refundColumns+` FROM refunds WHERE id = $1 FOR UPDATE`, r.ID))
		if err != nil {
			return dbError("refund: lock", err, "refund %q not found", r.ID)
		}
		out = cur
		// A patrol drive applies only while the refund still carries its lease token; a drive
		// whose lease ran out still reports a contradiction below (its answer may be the only
		// word of a refund the gateway paid after it was settled Failed by hand meanwhile).
		if token, leased := leaseOf(ctx, r.ID); leased {
			var holds bool
			if err := tx.QueryRow(ctx, `SELECT lease_token IS NOT DISTINCT FROM $2::uuid FROM refunds WHERE id = $1`, r.ID, token).Scan(&holds); err != nil {
				return dbError("refund: lease", err, "")
			}
			leaseLost = !holds
		}
		if mismatch == "" && gr.ID != "" {
			// An answer naming a gateway refund another of our refunds holds is about that one
			// (refundAnswerAbout): nothing applied, nothing kept; finance gets the case, and the
			// refund its next look.
			if err := lockGatewayRefund(ctx, tx, sess, gr.ID); err != nil {
				return err
			}
			other, err := refundAnswerAbout(ctx, tx, sess, r, gr)
			if err != nil {
				return err
			}
			if other != "" {
				return noteCase(ctx, tx, sess.ID, sess.OrderID, CaseGatewayMismatch, other, now, refundFact(r.ID, cur.Status, gr))
			}
		}
		if cur.Status != RefundPending {
			answer := status
			if answer == "" && mismatch == "" {
				// Pending at the gateway: it took the refund and will pay it. Against a refund
				// settled Failed meanwhile (by hand), that is as much a contradiction as
				// "succeeded"; against Succeeded it is the same story told early.
				answer = "pending"
				if cur.Status == RefundSucceeded {
					answer = ""
				}
			}
			if answer != "" && answer != cur.Status {
				// The gateway's word contradicts the outcome settled meanwhile: never written over
				// it, and never silent (a refund settled Failed by hand that the gateway did pay,
				// and the amount refundable again, must reach finance). The gateway's refund id is
				// kept on the row, so the next refund of the payment asks about it again first
				// (recheckRefundsFailedByHand) instead of paying the same amount twice.
				if _, err := tx.Exec(ctx, `UPDATE refunds SET gateway_refund_id = nullif($2, '') WHERE id = $1 AND gateway_refund_id IS NULL`, r.ID, gr.ID); err != nil {
					return dbError("refund: note the gateway's id", err, "")
				}
				return noteCase(ctx, tx, sess.ID, sess.OrderID, CaseGatewayMismatch,
					fmt.Sprintf("refund %s is %s here, but the gateway answers %s (%s)", r.ID, cur.Status, answer, cur.Detail), now,
					refundFact(r.ID, cur.Status, gr))
			}
			return nil // applied already (the patrol or a concurrent request got there first)
		}
		if leaseLost {
			// Still Pending: the drive that holds it now applies its own answer — or nobody
			// does (that drive flagged it: people decide it). The gateway's refund id is kept
			// either way, so whatever settles it later reads the gateway's word by id (a refund
			// settled Failed by hand is asked about before the next refund, also at a gateway
			// that cannot search its refunds; an outside review). Not an answer about another
			// refund (mismatch): that one is finance's case when the holder meets it.
			if gr.ID == "" || mismatch != "" {
				return nil
			}
			_, err := tx.Exec(ctx, `UPDATE refunds SET gateway_refund_id = $2 WHERE id = $1 AND gateway_refund_id IS NULL`, r.ID, gr.ID)
			return err
		}
		if mismatch != "" {
			return noteCase(ctx, tx, sess.ID, sess.OrderID, CaseGatewayMismatch, mismatch, now, refundFact(r.ID, cur.Status, gr))
		}
		if status == "" {
			_, err := tx.Exec(ctx, `UPDATE refunds SET gateway_refund_id = coalesce(nullif($2, ''), gateway_refund_id), updated_at = $3
				WHERE id = $1`, r.ID, gr.ID, now)
			out.GatewayRefundID = gr.ID
			return err
		}
		// Who caused it: the patrol (this replica) when it drove the refund under its lease,
		// otherwise the request that made it (the API client or the person).
		by := Actor{Kind: ActorSweeper, ID: s.cfg.ReplicaID}
		if _, leased := leaseOf(ctx, r.ID); !leased {
			kind, id, _ := strings.Cut(cur.CreatedBy, ":")
			by = Actor{Kind: ActorKind(kind), ID: id}
		}
		if out, err = settleRefundRow(ctx, tx, cur, status, detail, gr.ID, by, now); err != nil || booksDiffer == "" {
			return err
		}
		return noteCase(ctx, tx, sess.ID, sess.OrderID, CaseGatewayMismatch, booksDiffer, now, r.ID+" (refused: "+GatewayErrorCode(gerr)+")")
	})
	if err == nil && leaseLost {
		return out, ErrLeaseLost
	}
	return out, err
}

// settleRefundRow writes a refund's outcome (cur, locked by the caller under the order →
// session locks, guarded on the status cur has: Pending, or Failed by hand for a correction to
// Succeeded): its status with its feed event (who: by) in one statement, a settled refund no
// longer flagged, and for Succeeded the one RefundIssued ledger entry (and the payment's
// updated_at moved). The gateway's answer
// (driveRefund) and an approved four-eyes outcome (approveRefundOutcome) both settle through here.
func settleRefundRow(ctx context.Context, tx pgx.Tx, cur Refund, status, detail, gatewayRefundID string, by Actor, now time.Time) (Refund, error) {
	out, err := scanRefund(tx.QueryRow(ctx, `WITH r AS (
			UPDATE refunds SET status = $2, detail = $3,
				gateway_refund_id = coalesce(nullif($4, ''), gateway_refund_id), next_check_at = NULL, updated_at = $5,
				flagged_at = NULL, flag_reason = NULL
			WHERE id = $1 AND status = $8 RETURNING *
		), e AS (
			INSERT INTO refund_events (refund_id, from_status, to_status, actor_kind, actor_id, created_at)
			SELECT id, $8, status, $6, $7, updated_at FROM r
		)
		SELECT `+refundColumns+` FROM r`, cur.ID, status, detail, gatewayRefundID, now, string(by.Kind), by.ID, cur.Status))
	if err != nil {
		return Refund{}, dbError("refund: apply", err, "")
	}
	if status == RefundSucceeded {
		// The payment changed too (money went back): its updated_at moves, so reconciliation's
		// pass, which visits the sessions changed within its lookback, reads the refund back
		// (readBackRefunds) also when the payment itself was settled long before.
		if _, err := tx.Exec(ctx, `WITH l AS (INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, refund_id, created_at)
			VALUES ($1, $2, 'RefundIssued', $3, $4, $5, $6))
			UPDATE payment_sessions SET updated_at = greatest(updated_at, $6) WHERE id = $2`, cur.OrderID, cur.PaymentID, cur.Amount, cur.Currency, cur.ID, now); err != nil {
			return Refund{}, dbError("refund: ledger", err, "")
		}
	} else if out.FailedByHand() {
		// Settled Failed by hand, which the gateway may still pay: read back the same way.
		if _, err := tx.Exec(ctx, `UPDATE payment_sessions SET updated_at = greatest(updated_at, $2) WHERE id = $1`, cur.PaymentID, now); err != nil {
			return Refund{}, dbError("refund: payment", err, "")
		}
	}
	return out, nil
}

// DriveRefunds is one round of the patrol over Pending refunds (patrol.go): the same pool, lease
// and back-off as sessions. Each due refund is leased (SKIP LOCKED, a fresh token), asked about
// without ever refunding twice (askRefund), and released (releaseBatch) with the next step of
// the sweeper's schedule — or, when the schedule ran out, flagged with a refund_unsettled case
// for finance.
func (s *Service) DriveRefunds(ctx context.Context) (int, error) {
	rep, err := s.runRound(ctx, []patrolSource{s.refundSource()}, nil, 0)
	return rep.Driven, err
}

func (s *Service) refundSource() patrolSource {
	return patrolSource{kind: "refund", gateway: true, leases: &refundLeases, claim: func(ctx context.Context, limit int) ([]patrolJob, error) {
		now := s.cfg.Clock.Now()
		type leased struct {
			r     Refund
			token string
		}
		var due []leased
		err := s.inTx(ctx, "refunds: claim", func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `
				WITH due AS (
					SELECT id AS due_id FROM refunds
					WHERE status = 'Pending' AND flagged_at IS NULL AND next_check_at <= $1
					  AND (lease_until IS NULL OR lease_until <= $1)
					  -- A refund of another gateway's payment is its replicas' (gwOf).
					  AND ($5::text = '' OR EXISTS (SELECT 1 FROM payment_sessions ps WHERE ps.id = refunds.session_id AND ps.gateway = $5))
					ORDER BY next_check_at LIMIT $2 FOR UPDATE OF refunds SKIP LOCKED
				)
				UPDATE refunds SET lease_owner = $3, lease_until = $4, lease_token = gen_random_uuid()
				FROM due WHERE id = due.due_id RETURNING `+refundColumns+`, lease_token::text`,
				now, limit, s.cfg.ReplicaID, now.Add(s.cfg.LeaseDuration), s.gatewayName())
			if err != nil {
				return fmt.Errorf("refunds: claim: %w", err)
			}
			due, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (leased, error) {
				var l leased
				var err error
				l.r, err = scanRefund(withTrailing{r, []any{&l.token}})
				return l, err
			})
			return err
		})
		if err != nil {
			return nil, err
		}
		jobs := make([]patrolJob, len(due))
		for i, d := range due {
			jobs[i] = patrolJob{id: d.r.ID, token: d.token, leasedAt: now, run: func(ctx context.Context) driveEnd { return s.driveRefundLeased(ctx, d.r, d.token) }}
		}
		return jobs, nil
	}}
}

// driveRefundLeased drives one leased refund; like sessions' driveLeased, it reports whether its
// lease is to be given back (by releaseBatch, with the next step of the schedule).
func (s *Service) driveRefundLeased(ctx context.Context, r Refund, token string) driveEnd {
	ctx = withLease(ctx, r.ID, token)
	sess, err := s.Get(ctx, r.PaymentID)
	if err == nil {
		_, err = s.driveRefund(ctx, sess, r)
	}
	if errors.Is(err, ErrLeaseLost) {
		s.log.Warn("refund: lease lost during the drive; leaving it to its new holder", "refund", r.ID)
		return endLost
	}
	if err != nil {
		s.log.Info("refund: not settled this round", "refund", r.ID, "err", err)
	}
	return endRelease
}
