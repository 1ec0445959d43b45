package payments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Finance case kinds.
const (
	CaseLatePayment        = "late_payment"               // the gateway took money for a Failed/Canceled session
	CaseCancelLostRace     = "cancel_lost_race"           // a cancel was requested but the payment succeeded first
	CaseUnexpectedReversal = "unexpected_reversal"        // the gateway reversed a payment we did not ask to reverse
	CaseGatewayMismatch    = "gateway_mismatch"           // the gateway contradicts a Completed session, its id, or its amount or currency
	CaseDuplicatePayment   = "duplicate_gateway_payment"  // one session, several gateway payments
	CaseSweepExhausted     = "sweep_exhausted"            // the sweeper's schedule ran out without a final answer
	CaseUntrustedURL       = "untrusted_confirmation_url" // the gateway sent a payment page URL we do not send customers to
)

// Check asks the gateway about a session and applies the answer exactly once (design.md, "The
// locking core" 2). The gateway is asked first, with no transaction open; the answer is then
// applied in one short transaction under the order and session row locks, so a second
// concurrent Check waits, re-reads the applied state and does nothing.
func (s *Service) Check(ctx context.Context, actor Actor, id string) (Session, error) {
	ctx, span := s.startSpan(ctx, "payments.check", id, "")
	defer span.End()
	sess, err := s.Get(ctx, id)
	if err != nil {
		return Session{}, err
	}
	return s.check(ctx, actor, sess)
}

// check is Check of a session the caller has just read (the patrol's claim returns it).
func (s *Service) check(ctx context.Context, actor Actor, sess Session) (Session, error) {
	ctx = s.traceSession(ctx, sess)
	ctx, flush := s.deferCallLog(ctx) // the call's log row rides in the apply transaction
	defer flush()
	gp, found, err := s.gatewayState(ctx, sess)
	if sess.GatewayPaymentID != "" && gatewayNotFound(err) {
		// The gateway says the payment we registered does not exist (not a payment its search
		// listed and its GET does not know yet: that one is asked about again). Asking again for days will
		// not change that: flag the session for finance now, with a case, and leave its state.
		return s.flagMissingAtGateway(ctx, sess, err)
	}
	if GatewayErrorCode(err) == CodeOtherGateway {
		return sess, &Error{Code: ECONFLICT, Message: fmt.Sprintf("payment %s was registered at gateway %s: only a replica with GATEWAY=%s can ask about it", sess.ID, sess.Gateway, sess.Gateway), Err: err}
	}
	if err != nil {
		return sess, &Error{Code: EUNAVAIL, Message: "the gateway did not answer; the payment is unchanged", Err: err}
	}
	if !found {
		if sess.Status == StatusCompleted {
			// Completed by people (four-eyes resolution) before the gateway's id was known, and
			// the gateway has nothing under our reference: a contradiction for finance.
			return sess, s.inTx(ctx, "completed without gateway payment", func(tx pgx.Tx) error {
				return openCase(ctx, tx, sess.ID, sess.OrderID, CaseGatewayMismatch,
					"the gateway has no payment with reference "+sess.Reference()+" for a Completed session", s.cfg.Clock.Now(),
					missingFact(sess.Reference()))
			})
		}
		return sess, nil
	}
	if h := s.cfg.Hooks.AfterGatewayStatus; h != nil {
		h(ctx, sess.ID, gp)
	}
	handOff(ctx) // a patrol drive's last gateway call is behind it (every drive ends with its check)
	return s.applyGatewayPayment(ctx, actor, sess, gp, "gateway says "+string(gp.Status))
}

// flagMissingAtGateway flags a session whose gateway payment the gateway says does not exist
// and opens a gateway_mismatch case; the sweeper stops asking about it.
func (s *Service) flagMissingAtGateway(ctx context.Context, sess Session, cause error) (Session, error) {
	ctx, done := s.detachRecord(ctx)
	defer done()
	now := s.cfg.Clock.Now()
	reason := fmt.Sprintf("the gateway has no payment %s (%v)", sess.GatewayPaymentID, cause)
	var out Session
	err := s.inTx(ctx, "flag missing payment", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
		if err != nil {
			return err
		}
		out, err = flagForFinance(ctx, tx, cur, CaseGatewayMismatch, reason, now, missingFact(sess.GatewayPaymentID))
		return err
	})
	return out, err
}

// gatewayState asks the gateway what it knows of a session: by its payment id when we have one,
// otherwise by our reference (the registration's answer was lost). found=false: the gateway
// has no payment for this session (yet).
func (s *Service) gatewayState(ctx context.Context, sess Session) (GatewayPayment, bool, error) {
	if sess.GatewayPaymentID != "" {
		started := time.Now()
		gp, err := s.gwOf(sess).Status(ctx, sess.GatewayPaymentID)
		s.logGatewayAnswer(ctx, sess.ID, "status", "", started, err, "gateway says "+string(gp.Status))
		if err != nil {
			return GatewayPayment{}, false, err
		}
		return gp, true, nil
	}
	started := time.Now()
	found, err := s.gwOf(sess).FindByReference(ctx, sess.Reference())
	s.logGatewayAnswer(ctx, sess.ID, "find", "", started, err, fmt.Sprintf("%d payment(s) with our reference", len(found)))
	if err != nil {
		return GatewayPayment{}, false, err
	}
	found = distinctPayments(found)
	if len(found) == 0 {
		return GatewayPayment{}, false, nil
	}
	// The payment to attach, asked for by its id: a search index may lag (Stripe's by up to an
	// hour), and its copy must not judge the session (an outside review: a stale pending copy of
	// a payment Completed by people).
	started = time.Now()
	best, err := s.gwOf(sess).Status(ctx, pickPayment(found).ID)
	s.logGatewayAnswer(ctx, sess.ID, "status", "", started, err, "gateway says "+string(best.Status))
	if err != nil {
		return GatewayPayment{}, false, err
	}
	found = withAnswer(found, best)
	var late []string // the others' money held for a session that is over: its late case's
	for _, gp := range found {
		if gp.ID != best.ID && lateMoney(sess.Status, gp.Status) {
			late = append(late, gatewayFact(gp))
		}
	}
	if facts := duplicateFacts(found, best.ID, sess.Status); len(found) > 1 && (len(facts) > 0 || len(late) > 0) {
		// A gateway that ignored our idempotency key created several payments for one session.
		// Attach the most advanced one and tell finance about the others. Late money of another
		// than the one attached was dropped (only the attached one is applied, an outside review).
		detail := fmt.Sprintf("%d gateway payments carry reference %s; attached %s", len(found), sess.Reference(), best.ID)
		if err := s.inTx(ctx, "duplicate case", func(tx pgx.Tx) error {
			// The duplicate case before the late one, as noteLatePayment notes them: one order of
			// the finance rows for every path (no deadlock with a reconciliation of the session).
			if len(facts) > 0 {
				if err := noteCase(ctx, tx, sess.ID, sess.OrderID, CaseDuplicatePayment, detail, s.cfg.Clock.Now(), facts...); err != nil {
					return err
				}
			}
			if len(late) == 0 {
				return nil
			}
			return noteLatePayment(ctx, tx, sess, "the gateway holds money for a "+string(sess.Status)+" session: "+detail, s.cfg.Clock.Now(), late)
		}); err != nil {
			return GatewayPayment{}, false, err
		}
	}
	return best, true, nil
}

// withAnswer is found with gp, the gateway's answer by id about one of them, in place of the
// search's copy (or added, when the search did not list it).
func withAnswer(found []GatewayPayment, gp GatewayPayment) []GatewayPayment {
	for i := range found {
		if found[i].ID == gp.ID {
			found[i] = gp
			return found
		}
	}
	return append(found, gp)
}

// duplicateFacts are the facts of a duplicate_gateway_payment case about found, the payments
// carrying a session's reference: each one other than the session's own (own: the one attached,
// else the one Check attaches) that holds or may still take money. The own payment's progress is no
// news about a duplicate (an outside review: a resolved case opened again when the customer
// paid the own payment); a payment that took nothing (declined, expired, reversed) asks nothing
// of finance; and money held for a Failed or Canceled session is its late_payment case's (one
// case for one sum: the same review found two, each inviting a refund).
func duplicateFacts(found []GatewayPayment, own string, st Status) []string {
	var facts []string
	for _, gp := range found {
		switch {
		case gp.ID == own, gp.Status == GatewayDeclined, gp.Status == GatewayExpired, gp.Status == GatewayReversed:
		case lateMoney(st, gp.Status):
		default:
			facts = append(facts, gatewayFact(gp))
		}
	}
	return facts
}

// noteSecondPayment notes gp, a payment carrying sess's reference that is not the one sess is
// attached to (a gateway that ignored our key made two), in tx, as every path reads it: money
// held for a Failed or Canceled session is its late_payment case's (noteLatePayment); one that
// holds or may take money is the duplicate_gateway_payment case's (duplicateFacts); one that
// took nothing asks nothing of finance (noted false). event names the webhook event it came
// with ("" for none).
func noteSecondPayment(ctx context.Context, tx pgx.Tx, sess Session, gp GatewayPayment, event string, now time.Time) (noted bool, err error) {
	by := ""
	if event != "" {
		by = " (event " + event + ")"
	}
	if lateMoney(sess.Status, gp.Status) {
		detail := fmt.Sprintf("gateway payment %s, a second payment carrying this session's reference, holds money for a %s session%s",
			gatewayFact(gp), sess.Status, by)
		return true, noteLatePayment(ctx, tx, sess, detail, now, []string{gatewayFact(gp)})
	}
	facts := duplicateFacts([]GatewayPayment{gp}, sess.GatewayPaymentID, sess.Status)
	if len(facts) == 0 {
		return false, nil
	}
	detail := fmt.Sprintf("gateway payment %s carries this session's reference but the session is paid through %s%s",
		gatewayFact(gp), sess.GatewayPaymentID, by)
	return true, noteCase(ctx, tx, sess.ID, sess.OrderID, CaseDuplicatePayment, detail, now, facts...)
}

// lateMoney: a gateway payment holding money (succeeded, authorized) for a session that is over
// (Failed, Canceled) — its late_payment case's.
func lateMoney(st Status, gs GatewayStatus) bool {
	return (st == StatusFailed || st == StatusCanceled) && (gs == GatewaySucceeded || gs == GatewayAuthorized)
}

// foreignFact is gatewayFact of a payment carrying another reference than the session the
// gateway's answer was for (never attached): another's money, never the session's
// (heldBySession).
func foreignFact(gp GatewayPayment) string { return "foreign " + gatewayFact(gp) }

// heldBySession says whether fact, a case's fact, is a gatewayFact of sess's own gateway payment
// (or, for a session that never learnt its id, of a payment carrying its reference: the
// answer was lost or contradicted, and not attached) holding money for it now that it is over
// (lateMoney). Refund facts, missing payments and foreign payments (foreignFact) never are.
func heldBySession(fact string, sess Session) bool {
	id, rest, ok := strings.Cut(fact, " (")
	if !ok || strings.Contains(id, " ") || (sess.GatewayPaymentID != "" && id != sess.GatewayPaymentID) {
		return false
	}
	st, _, _ := strings.Cut(rest, ",")
	return lateMoney(sess.Status, GatewayStatus(st))
}

// distinctPayments keeps one copy of each payment a search listed. A search whose index moves
// between its pages (Stripe's is paginated and eventually consistent) can list one payment
// twice, and two copies of one payment are not two payments: they opened a false duplicate case
// (an outside review). Of two copies the one further along is kept (a payment only moves from
// pending to authorized to an end), else the first (the newest listing).
func distinctPayments(ps []GatewayPayment) []GatewayPayment {
	stage := func(st GatewayStatus) int {
		switch st {
		case GatewayPending:
			return 0
		case GatewayAuthorized:
			return 1
		}
		return 2
	}
	out := make([]GatewayPayment, 0, len(ps))
	at := make(map[string]int, len(ps))
	for _, p := range ps {
		i, seen := at[p.ID]
		switch {
		case !seen:
			at[p.ID] = len(out)
			out = append(out, p)
		case stage(p.Status) > stage(out[i].Status):
			out[i] = p
		}
	}
	return out
}

// pickPayment prefers the payment that moved money furthest: succeeded, then authorized, then
// pending, then the newest.
func pickPayment(ps []GatewayPayment) GatewayPayment {
	rank := map[GatewayStatus]int{GatewaySucceeded: 4, GatewayAuthorized: 3, GatewayPending: 2}
	best := ps[0]
	for _, p := range ps[1:] {
		if rank[p.Status] > rank[best.Status] {
			best = p
		}
	}
	return best
}

// outcome is what one gateway answer means for a session in its current state.
type outcome struct {
	to         Status // "" = no status change
	caseKind   string
	caseDetail string
}

// decide maps (our state, the gateway's state) to an outcome. Pure; tested edge by edge.
// Gateway states never move a session backwards (webhooks come out of order), and an answer that
// contradicts a terminal state changes no money: it opens a finance case.
func decide(cur Status, gs GatewayStatus, weAskedReverse bool) outcome {
	switch gs {
	case GatewayPending:
		if cur == StatusRegistering || cur == StatusUnknown {
			return outcome{to: StatusRegistered}
		}
		if cur == StatusCompleted {
			// What the gateway says when asked is the truth now, and no captured payment goes
			// back to pending: a Completed session (settled by people, say) the gateway never
			// captured is money we booked and may not have (reconciliation says the same).
			return outcome{caseKind: CaseGatewayMismatch, caseDetail: "gateway says pending for a Completed session"}
		}
	case GatewayAuthorized:
		switch cur {
		case StatusRegistering, StatusRegistered, StatusUnknown:
			return outcome{to: StatusAuthorized}
		case StatusCompleted:
			return outcome{caseKind: CaseGatewayMismatch, caseDetail: "gateway says authorized (not captured) for a Completed session"}
		case StatusFailed, StatusCanceled:
			return outcome{caseKind: CaseLatePayment, caseDetail: "gateway authorized a payment for a " + string(cur) + " session"}
		}
	case GatewaySucceeded:
		switch cur {
		case StatusRegistering, StatusRegistered, StatusUnknown, StatusAuthorized:
			return outcome{to: StatusCompleted}
		case StatusCanceling:
			return outcome{to: StatusCompleted, caseKind: CaseCancelLostRace, caseDetail: "the payment succeeded before our reverse; refund if the customer still wants to cancel"}
		case StatusFailed, StatusCanceled:
			return outcome{caseKind: CaseLatePayment, caseDetail: "gateway captured money for a " + string(cur) + " session"}
		}
	case GatewayDeclined, GatewayExpired:
		if cur.Active() {
			return outcome{to: StatusFailed}
		}
		if cur == StatusCompleted {
			return outcome{caseKind: CaseGatewayMismatch, caseDetail: "gateway says " + string(gs) + " for a Completed session"}
		}
	case GatewayReversed:
		switch {
		case cur == StatusCanceling || (weAskedReverse && cur.Active()):
			if cur == StatusCanceling {
				return outcome{to: StatusCanceled}
			}
			return outcome{to: StatusFailed}
		case cur == StatusCompleted:
			return outcome{caseKind: CaseGatewayMismatch, caseDetail: "gateway says reversed for a Completed session"}
		case cur.Active():
			return outcome{to: StatusFailed, caseKind: CaseUnexpectedReversal, caseDetail: "the gateway reversed a payment nobody here asked to reverse"}
		}
	}
	return outcome{}
}

// applyGatewayPayment applies what the gateway says about a session — from Check, a register
// answer, the sweeper or a webhook (after fetching) — in one transaction under the order and
// session locks. Completed writes the order's Paid status and the PaymentReceived entry in the
// same transaction; an answer already applied writes nothing.
//
// sess is the session as the caller last read it: only its id and order (which never changes)
// are used, to take the locks; everything decided is read again under them.
//
// A patrol drive's answer (ctx carries its lease) goes through the replica's settle batcher
// instead (settle_batch.go): several drives' answers in one transaction, each the same writes.
//
// An answer that would open a finance case against a state the session reached after the caller
// read it (another check, a webhook or a cancel decided in between) may be older than the answer
// that decided: two checks' answers are not applied in the order the gateway gave them. Such an
// answer writes nothing; the gateway is asked again about the session as it is now, and that
// answer is applied (staleAnswer). A contradiction that is real survives the second question.
func (s *Service) applyGatewayPayment(ctx context.Context, actor Actor, sess Session, gp GatewayPayment, reason string) (Session, error) {
	asking := ctx                    // asking again stays bounded by the caller's time and ends at shutdown
	ctx, done := s.detachRecord(ctx) // the gateway has spoken: its answer must be recorded
	defer done()
	leaseLost := false
	for asked := 1; ; asked++ {
		seen := sess.Status
		if asked > maxAsks {
			seen = "" // the session keeps moving: this answer is applied as it is
		}
		var out Session
		var err error
		if token, leased := leaseOf(ctx, sess.ID); leased && s.settles != nil {
			out, err = s.settles.settle(&settleItem{ctx: ctx, actor: actor, sess: sess, seen: seen, token: token, gp: gp, reason: reason, call: pendingCallLog(ctx)})
		} else {
			out, err = s.applyOne(ctx, actor, sess, seen, gp, reason)
		}
		if _, leased := leaseOf(ctx, sess.ID); leased && errors.Is(err, ErrLeaseLost) {
			// The drive's lease ran out while the gateway took its time. Its answer is never
			// written over a live holder's work, but a session settled meanwhile (by people,
			// four eyes) that the gateway now contradicts must reach finance, not be dropped
			// in silence: the answer goes through the request path's apply, whose stale-
			// answer rule asks the gateway again and opens the case only for a contradiction
			// that is real now. The drive still stops as one that lost its lease.
			if settled, serr := s.settledMeanwhile(ctx, sess.ID); serr != nil || !settled {
				return out, err
			}
			leaseLost = true
			ctx = context.WithValue(ctx, leaseCtxKey{}, nil)
			asking = context.WithValue(asking, leaseCtxKey{}, nil)
			continue
		}
		if attachedElsewhere(err) {
			return s.flagAttachedElsewhere(ctx, sess, gp)
		}
		var stale *staleAnswer
		if !errors.As(err, &stale) {
			return out, lostLease(err, leaseLost)
		}
		if asking.Err() != nil {
			// The caller's time is up (a drive past its deadline, a replica shutting down): the
			// newer decision stands, and the next look asks (an outside review: these asks ran
			// detached, after the lease and past the unit's stop timeout).
			return stale.now, lostLease(nil, leaseLost)
		}
		s.log.Info("a gateway answer was overtaken by a newer decision; asking the gateway again",
			"session_id", sess.ID, "answer", string(gp.Status), "read", string(sess.Status), "now", string(stale.now.Status))
		if err := retakeSlot(asking); err != nil {
			// A patrol drive asks within its round's width: it waited for a slot until its time
			// was up. The newer decision stands; the next look asks.
			return stale.now, lostLease(nil, leaseLost)
		}
		fresh, found, gerr := s.gatewayState(asking, stale.now)
		handOff(asking) // asked: the slot is the next drive's while this answer is written
		if gerr != nil || !found {
			// The newer decision stands; a real contradiction is found by the next look.
			return stale.now, lostLease(nil, leaseLost)
		}
		sess, gp = stale.now, fresh
	}
}

// attachedElsewhere: an apply's attach of the gateway's payment found it another session's at
// this gateway (the unique index, migration 00420).
func attachedElsewhere(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "payment_sessions_gateway_payment_key"
}

// flagAttachedElsewhere flags sess for finance with a gateway_mismatch case: the gateway answered
// it (by its reference) with a payment another session holds already — a gateway that mixed its
// references or keys up. Nothing is attached or applied. The unique index refused the attach and
// every look failed with it, no case and no flag, until the schedule ran out days later (a review
// of answers about other things).
func (s *Service) flagAttachedElsewhere(ctx context.Context, sess Session, gp GatewayPayment) (Session, error) {
	var out Session
	err := s.inTx(ctx, "apply: a payment attached elsewhere", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
		if err != nil {
			return err
		}
		var holder string
		if err := tx.QueryRow(ctx, `SELECT coalesce(min(o.id::text), '') FROM payment_sessions o
			WHERE o.gateway = (SELECT gateway FROM payment_sessions WHERE id = $1) AND o.gateway_payment_id = $2 AND o.id <> $1`,
			cur.ID, gp.ID).Scan(&holder); err != nil {
			return dbError("apply: whose payment", err, "")
		}
		out, err = flagForFinance(ctx, tx, cur, CaseGatewayMismatch, fmt.Sprintf(
			"the gateway answered with payment %s (%s), which is session %s's; not attached, nothing applied", gp.ID, gp.Status, orNone(holder)),
			s.cfg.Clock.Now(), foreignFact(gp))
		return err
	})
	return out, err
}

// settledMeanwhile reports whether session id is in a terminal state (read without a lock: a
// drive that lost its lease asks it before applying its answer as a request would).
func (s *Service) settledMeanwhile(ctx context.Context, id string) (bool, error) {
	var st Status
	if err := s.db.QueryRow(ctx, `SELECT status FROM payment_sessions WHERE id = $1`, id).Scan(&st); err != nil {
		return false, dbError("apply: session", err, "payment %q not found", id)
	}
	return st.Terminal(), nil
}

// lostLease is err, or ErrLeaseLost for a drive whose answer was applied after its lease was lost.
func lostLease(err error, lost bool) error {
	if err == nil && lost {
		return ErrLeaseLost
	}
	return err
}

// maxAsks bounds how often one apply asks the gateway about a session that keeps moving.
const maxAsks = 3

// staleAnswer is an answer overtaken by a newer decision (applyGatewayPayment): the session
// left the state seen before the gateway was asked, and the answer would open a case against
// the state it is in now. Nothing was written; now is the session as read under the locks.
type staleAnswer struct{ now Session }

func (e *staleAnswer) Error() string {
	return "apply: the gateway's answer was overtaken by a newer decision (now " + string(e.now.Status) + ")"
}

// applyOne is applyGatewayPayment in a transaction of its own. seen is the session's status
// when the gateway was asked ("": do not compare).
func (s *Service) applyOne(ctx context.Context, actor Actor, sess Session, seen Status, gp GatewayPayment, reason string) (Session, error) {
	id := sess.ID
	ctx, span := s.startSpan(ctx, "payments.apply", id, sess.OrderID)
	defer span.End()
	ctx = s.traceSession(ctx, sess)
	now := s.cfg.Clock.Now()
	var out Session
	var from Status // the status this apply moved the session from, read under its locks
	call := pendingCallLog(ctx)
	mayHaveCommitted, err := s.inTxCommit(ctx, "apply gateway state", func(tx pgx.Tx) error {
		// The locks and whether we asked for a reverse, in one round trip; with them the log row
		// of the gateway call this answer came from (deferCallLog).
		var asked bool
		cur, err := lockOrderAndSessionWith(ctx, tx, sess.OrderID, id, func(b *pgx.Batch) {
			if call != nil {
				b.Queue(insertGatewayCall, call.args...)
			}
			b.Queue(`SELECT EXISTS (SELECT 1 FROM reverse_operations WHERE session_id = $1)`, id).QueryRow(func(r pgx.Row) error {
				if err := r.Scan(&asked); err != nil {
					return fmt.Errorf("apply: reverse op: %w", err)
				}
				return nil
			})
		})
		if err != nil {
			return err
		}
		if h := s.cfg.Hooks.AfterApplyLock; h != nil {
			h(ctx, id)
		}
		from = cur.Status
		out, err = s.applyLocked(ctx, tx, actor, cur, seen, asked, gp, reason, now, nil, true)
		return err
	})
	if call != nil {
		call.committed = err == nil
		call.uncertain = mayHaveCommitted // the commit itself failed: the row may be in
	}
	if err != nil {
		return Session{}, err
	}
	if moved, ok := ctx.Value(movedCtxKey{}).(*movedByCall); ok && from != out.Status {
		if moved.from == "" {
			moved.from = from
		}
		moved.to = out.Status
	}
	leaseEnded(ctx, out)
	return out, nil
}

// movedByCall is what the applies of one call moved the session through (committed): the
// status the first moved it from and the one the last moved it to ("" when none moved it). A
// call that wants to know (CheckAudited) puts one in its context (movedCtxKey); applyOne fills it.
type movedByCall struct{ from, to Status }

type movedCtxKey struct{}

// applyLocked decides and writes what gp means for cur, the session as read under the order and
// session locks the caller holds in tx (asked: a reverse was asked for it; seen: its status when
// the gateway was asked, "" not to compare; see staleAnswer). The transition and the
// order's Paid status with its ledger entry go in one round trip.
//
// queue, when not nil, collects the plain settles of a settle batch, which the caller writes in
// tx after every session of the batch was decided (settle_batch.go): a transition, and for
// Completed the order and ledger, nothing else. The session is filled once they are written
// (*queue.into, not the returned session). Everything else (cases, flags, attachments, reverses)
// is written here at once.
//
// last says the caller does nothing in tx after this call: when the transition (and the order's
// completion) is all that is left to write, they are sent with the COMMIT (commitWith), one
// round trip less. Whether a failed call's transaction may have committed all the same is then
// the transaction's to say (inTxCommit): not when the server refused a statement (a refused
// guard, which raises in SQL, skips the COMMIT).
func (s *Service) applyLocked(ctx context.Context, tx pgx.Tx, actor Actor, cur Session, seen Status, asked bool, gp GatewayPayment, reason string, now time.Time, queue *settleQueue, last bool) (out Session, err error) {
	id := cur.ID
	out = cur
	if cur.GatewayPaymentID != "" && gp.ID != "" && cur.GatewayPaymentID != gp.ID && gp.Reference == cur.Reference() {
		// A second payment carrying this session's reference (a gateway that ignored our key
		// made two): read as the webhook's secondPayment and reconciliation read it. Two events
		// of two such payments of an unattached session, at once on two replicas: one attached
		// its payment while the other's delivery asked the gateway about the second, which was
		// then filed as a gateway_mismatch here and as the duplicate case by secondPayment — one
		// captured sum in two open cases, each inviting a refund (an outside review, webhooks).
		_, err := noteSecondPayment(ctx, tx, cur, gp, "", now)
		return out, err
	}
	if cur.GatewayPaymentID != "" && gp.ID != "" && cur.GatewayPaymentID != gp.ID {
		return out, noteCase(ctx, tx, id, cur.OrderID, CaseGatewayMismatch,
			fmt.Sprintf("gateway payment %s (%s) is not the session's %s", gp.ID, gp.Status, cur.GatewayPaymentID), now, gatewayFact(gp))
	}
	if cur.GatewayPaymentID == "" && gp.ID != "" && gp.Reference != cur.Reference() {
		// A payment about to be attached must be this session's: a registration answer (Create,
		// the patrol's or a cancel's repeat) is taken by its key alone, and a gateway that mixed
		// keys up (a broken idempotency store, a replay routed to another merchant) would have
		// a stranger's payment — succeeded, say — complete this order, and the real owner's
		// session could never attach it (one session per gateway payment). Look-ups by
		// reference and webhook hints are matched on it already (an outside review). Before the
		// amount's check: a stranger's payment is for a stranger's amount, and taken as this
		// session's mismatch it was its late payment once the session was settled Failed (a
		// review: the order held in review by another's money).
		return flagForFinance(ctx, tx, cur, CaseGatewayMismatch, fmt.Sprintf(
			"the gateway's payment %s (%s) carries reference %q, not the session's %s; not attached, nothing applied",
			gp.ID, gp.Status, gp.Reference, cur.Reference()), now, foreignFact(gp))
	}
	if mismatch := answerMismatch(cur, gp); mismatch != "" {
		if oc := decide(cur.Status, gp.Status, asked); oc.caseKind == CaseLatePayment && oc.to == "" {
			// Money held for a session that is over, for another amount: the late_payment case,
			// as reconciliation finds it, the amounts in its detail (an outside review: a
			// gateway_mismatch case here and a late_payment case there, one sum in two cases).
			return out, noteCase(ctx, tx, id, cur.OrderID, CaseLatePayment, oc.caseDetail+": "+mismatch, now, gatewayFact(gp))
		}
		return flagForFinance(ctx, tx, cur, CaseGatewayMismatch, mismatch, now, gatewayFact(gp))
	}
	patch := sessionPatch{}
	untrusted := ""
	if cur.GatewayPaymentID == "" && gp.ID != "" {
		patch.gatewayPaymentID = gp.ID
		patch.confirmationURL = gp.ConfirmationURL
		if untrusted = s.confirmationURLProblem(gp.ConfirmationURL); untrusted != "" {
			patch.confirmationURL = "" // never stored, so never rendered nor redirected to
		}
		if cur.Status.Terminal() {
			// A payment found for a session already over (people settled it while a drive
			// looked): recorded, but no customer is to be sent to pay it.
			patch.confirmationURL, untrusted = "", ""
		}
	}
	oc := decide(cur.Status, gp.Status, asked)
	if oc.caseKind != "" && seen != "" && cur.Status != seen {
		return out, &staleAnswer{now: cur} // before any write (applyGatewayPayment asks again)
	}
	reversed := oc.to == StatusCanceled || (oc.to == StatusFailed && asked)
	if oc.to != "" {
		if !oc.to.Terminal() {
			next := now.Add(s.cfg.Backoff[0])
			patch.nextCheckAt = &next
		} else if _, leased := leaseOf(ctx, id); leased {
			// The caller locked the row only while it carried this drive's token
			// (lockOrderAndSessionWith, settleBatch): the lease ends with the transition.
			patch.endLease = true
		}
		if queue != nil && untrusted == "" && oc.caseKind == "" && !reversed {
			// A plain settle: written with the batch's others, and *queue.into filled, when the
			// caller writes its queue (settle_batch.go).
			return out, queue.add(cur, oc.to, actor, reason, patch)
		}
		b := &pgx.Batch{}
		if err := queueTransition(b, id, oc.to, actor, reason, now, patch, &out); err != nil {
			return out, err
		}
		if oc.to == StatusCompleted {
			queueCompleteOrder(b, cur, now)
			if asked {
				// The capture overtook our reverse (a check or webhook came before the reverse's
				// answer, or its repeat): the reverse is refused with the transition, or it would
				// stay Pending with nothing left to finish it.
				b.Queue(`UPDATE reverse_operations SET status = 'Refused', detail = 'the payment was captured before the reverse', updated_at = $2
					WHERE session_id = $1 AND status = 'Pending'`, id, now)
			}
		}
		if last && !reversed && untrusted == "" && oc.caseKind == "" {
			// Nothing follows: the COMMIT rides with the batch. Its statements' callbacks reject
			// nothing the server accepted (the guards raise in SQL, and a refused one makes the
			// server skip the COMMIT; a connection's end is no refusal: pipelinedTx.sentCommit).
			if err := commitWith(ctx, tx, b); err != nil {
				return out, transitionError(id, err)
			}
			return out, nil
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return out, transitionError(id, err)
		}
		if reversed {
			// The cancel is done: reversed by the gateway, or (declined, expired) nothing was
			// ever taken and there is nothing to reverse; the detail says which.
			detail := "the gateway reversed the payment"
			if oc.to != StatusCanceled {
				detail = "nothing to reverse: the gateway says " + string(gp.Status)
			}
			if _, err := tx.Exec(ctx, `UPDATE reverse_operations SET status = 'Succeeded', detail = $3, updated_at = $2
				WHERE session_id = $1 AND status = 'Pending'`, id, now, detail); err != nil {
				return out, fmt.Errorf("apply: reverse op done: %w", err)
			}
		}
	} else if patch.gatewayPaymentID != "" {
		if _, err := tx.Exec(ctx, `UPDATE payment_sessions SET gateway_payment_id = $2,
			confirmation_url = coalesce(nullif($3, ''), confirmation_url), updated_at = $4
			WHERE id = $1 AND gateway_payment_id IS NULL`, id, patch.gatewayPaymentID, patch.confirmationURL, now); err != nil {
			return out, dbError("apply: attach", err, "")
		}
		out.GatewayPaymentID = patch.gatewayPaymentID
		if patch.confirmationURL != "" {
			out.ConfirmationURL = patch.confirmationURL
		}
	}
	if untrusted != "" {
		if out, err = flagForFinance(ctx, tx, out, CaseUntrustedURL, untrusted, now); err != nil {
			return out, err
		}
	}
	if oc.caseKind != "" {
		// noteCase: a contradiction after another of the same kind (the gateway reversing a
		// payment whose wrong amount finance is looking at) is added to the open case. With
		// openCase it was dropped, and once that case was closed nothing said the money had
		// gone back: a webhook answered 200 is not sent again, the patrol drives no Completed
		// session (an outside review).
		return out, noteCase(ctx, tx, id, cur.OrderID, oc.caseKind, oc.caseDetail, now, gatewayFact(gp))
	}
	return out, nil
}

// completeOrder marks the order Paid and writes its one PaymentReceived entry, in the caller's
// transaction. The UPDATE is guarded on the order still awaiting payment through THIS session;
// the unique partial index accounting_entries_one_payment_received is the last line.
func completeOrder(ctx context.Context, tx pgx.Tx, sess Session, now time.Time) error {
	var b pgx.Batch
	queueCompleteOrder(&b, sess, now)
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return dbError("complete: order and ledger", err, "")
	}
	return nil
}

// queueCompleteOrder queues completeOrder's one statement into b: the entry is written only for
// the order row the guarded UPDATE changed, and no entry written fails the statement in SQL
// (migration 00440's pitlane_order_completed, SQLSTATE PT500), so the caller's transaction rolls
// back and a COMMIT pipelined behind it is skipped.
func queueCompleteOrder(b *pgx.Batch, sess Session, now time.Time) {
	b.Queue(`WITH paid AS (
			UPDATE orders SET status = 'Paid', paid_session_id = $2, active_session_id = NULL, updated_at = $5
			WHERE order_id = $1 AND status = 'AwaitingPayment' AND active_session_id = $2
			RETURNING order_id),
		entry AS (
			INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, created_at)
			SELECT order_id, $2, 'PaymentReceived', $3, $4, $5 FROM paid
			RETURNING 1)
		SELECT pitlane_order_completed((SELECT count(*) FROM entry), $1, $2)`,
		sess.OrderID, sess.ID, sess.Amount, sess.Currency, now)
}

// openCase opens a finance case unless one of the same kind is already open for the session.
// Finance rows come last in the lock order.
func openCase(ctx context.Context, tx pgx.Tx, sessionID, orderID, kind, detail string, now time.Time, facts ...string) error {
	detail, facts, resolved, err := newsOf(ctx, tx, sessionID, kind, detail, facts)
	if err != nil || resolved {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at, facts)
		VALUES ($1, $2, $3, $4, $5, coalesce($6::text[], '{}'))
		ON CONFLICT (session_id, kind) WHERE resolved_at IS NULL DO NOTHING`, sessionID, orderID, kind, detail, now, facts)
	if err != nil {
		return fmt.Errorf("open case %s: %w", kind, err)
	}
	return nil
}

// noteCase is openCase for news about one of several things a session's case may cover (its
// refunds, its payments): when a case of the kind is open already, the detail is added to it
// (once: news with facts only when one of them is new, news without facts only when its detail
// is; at most 8,000 characters in all) instead of being dropped, so a refund's contradiction or
// a second late payment is never silent behind an older case about something else, and the same
// news told in another path's words does not change a case finance is reading.
func noteCase(ctx context.Context, tx pgx.Tx, sessionID, orderID, kind, detail string, now time.Time, facts ...string) error {
	detail, facts, resolved, err := newsOf(ctx, tx, sessionID, kind, detail, facts)
	if err != nil || resolved {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at, facts)
		VALUES ($1, $2, $3, $4, $5, coalesce($6::text[], '{}'))
		ON CONFLICT (session_id, kind) WHERE resolved_at IS NULL DO UPDATE
			SET detail = left(finance_cases.detail || E'\n' || 'Also (' || to_char($5::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') || ' UTC): ' || EXCLUDED.detail, 8000),
			facts = ARRAY(SELECT DISTINCT f FROM unnest(finance_cases.facts || EXCLUDED.facts) f ORDER BY f) -- one order: the case as read (caseSeenSQL) moves only with news
			WHERE CASE WHEN cardinality(EXCLUDED.facts) > 0 THEN NOT (EXCLUDED.facts <@ finance_cases.facts)
				ELSE strpos(finance_cases.detail, EXCLUDED.detail) = 0 END`, sessionID, orderID, kind, detail, now, facts)
	if err != nil {
		return fmt.Errorf("note case %s: %w", kind, err)
	}
	return nil
}

// Facts are what a finance case is about, worded the same by every path that finds it (a Check,
// a webhook, the patrol, reconciliation), so a contradiction finance resolved is known again
// whoever finds it next and however its detail is worded (finance_cases.facts, migration 00740).

// gatewayFact is a gateway payment as a case's fact: its id, status, amount and currency (any
// of them changing is new news).
func gatewayFact(gp GatewayPayment) string {
	return fmt.Sprintf("%s (%s, %d %s)", gp.ID, gp.Status, gp.Amount, gp.Currency)
}

// factPayment is the gateway payment id a gatewayFact names.
func factPayment(fact string) string {
	id, _, _ := strings.Cut(fact, " (")
	return id
}

// missingFact: the gateway has no payment id (or, for a reference, none carrying it).
func missingFact(id string) string { return id + " (missing)" }

// paymentFacts is gatewayFact of each of ps: the facts of a duplicate_gateway_payment case (each
// payment carrying the session's reference, with its status: a second payment that was pending
// when finance resolved the case and is captured later is new news; an outside review: the fact
// named the ids only, and the second charge never reached finance again), and the parts of
// describePayments.
func paymentFacts(ps []GatewayPayment) []string {
	facts := make([]string, len(ps))
	for i, p := range ps {
		facts[i] = gatewayFact(p)
	}
	return facts
}

// factsResolved reports whether every one of facts is in a case of the session and kind that
// finance resolved: the contradiction is one finance has dealt with, and stays the same. No
// facts: never (news whose facts are not known opens its case as before).
func factsResolved(ctx context.Context, tx pgx.Tx, sessionID, kind string, facts []string) (bool, error) {
	fresh, err := unresolvedFacts(ctx, tx, sessionID, kind, facts)
	return len(facts) > 0 && len(fresh) == 0, err
}

// newsOf is what a case of kind about facts has to tell finance: the facts no resolved case of
// the session holds (unresolvedFacts), and detail with the others named as resolved before;
// resolved when there are facts and every one is. A new late payment beside one finance had
// refunded by hand named both as open again (an outside review): a second refund invited.
func newsOf(ctx context.Context, tx pgx.Tx, sessionID, kind, detail string, facts []string) (string, []string, bool, error) {
	// A case's detail is read by finance on its pages: the gateway's text in it (a webhook's
	// payment id, an event id) shows each character that does not show as itself as its code
	// point (storable), so a right-to-left override cannot turn the line around. Refusing such
	// events instead refused another shop's on a shared gateway account whose reference holds an
	// emoji (a zero-width joiner), redelivered for days (a review).
	detail = storable(detail)
	fresh, err := unresolvedFacts(ctx, tx, sessionID, kind, facts)
	switch {
	case err != nil:
		return "", nil, false, err
	case len(fresh) == len(facts):
		return detail, facts, false, nil
	case len(fresh) == 0:
		return "", nil, true, nil
	}
	var before []string
	for _, f := range facts {
		if !slices.Contains(fresh, f) {
			before = append(before, f)
		}
	}
	return detail + " (resolved in an earlier case: " + strings.Join(before, ", ") + ")", fresh, false, nil
}

// unresolvedFacts is those of facts that no case of the session and kind (moneyKinds) finance
// resolved holds.
//
// It first waits for a resolution of the session's open case of the kind that is in flight
// (ResolveCase locks the case row only): read before that resolution committed, the facts were
// not resolved yet, the finder's insert waited for the case row, and went through once the
// resolution took the row out of finance_cases_one_open — a second open case of the fact finance
// had just resolved, inviting a second refund by hand (an outside review). Finance rows come
// last in the lock order; the next statement's snapshot sees the resolution.
func unresolvedFacts(ctx context.Context, tx pgx.Tx, sessionID, kind string, facts []string) ([]string, error) {
	if len(facts) == 0 {
		return nil, nil
	}
	kinds := moneyKinds(kind)
	if _, err := tx.Exec(ctx, `SELECT FROM finance_cases WHERE session_id = $1 AND kind = ANY ($2) AND resolved_at IS NULL FOR UPDATE`,
		sessionID, kinds); err != nil {
		return nil, fmt.Errorf("case %s: wait for a resolution: %w", kind, err)
	}
	var fresh []string
	err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(f ORDER BY o), '{}') FROM unnest($3::text[]) WITH ORDINALITY AS u(f, o) WHERE NOT EXISTS (
			SELECT 1 FROM finance_cases r WHERE r.session_id = $1 AND r.kind = ANY ($2) AND r.resolved_at IS NOT NULL AND f = ANY (r.facts))`,
		sessionID, kinds, facts).Scan(&fresh)
	if err != nil {
		return nil, fmt.Errorf("case %s: resolved facts: %w", kind, err)
	}
	return fresh, nil
}

// moneyKinds are the kinds whose cases judge kind's facts: a payment holding money for a session
// is a duplicate_gateway_payment case's while the session is under way and a late_payment case's
// once it is Failed or Canceled, and the one sum is one case whichever came first (an outside
// review: a duplicate finance refunded by hand came back as a late payment when the session
// failed).
func moneyKinds(kind string) []string {
	if kind == CaseLatePayment || kind == CaseDuplicatePayment {
		return []string{CaseLatePayment, CaseDuplicatePayment}
	}
	return []string{kind}
}

// noteLatePayment notes money held for a Failed or Canceled session (facts: gatewayFact of each
// payment): a payment an open duplicate_gateway_payment case of the session names already is
// that case's news (noteCase), the rest the session's late_payment case's, so one sum is never
// in two open cases (the same review: a duplicate case, then the session failed, then a late
// case about the same captured payment).
func noteLatePayment(ctx context.Context, tx pgx.Tx, sess Session, detail string, now time.Time, facts []string) error {
	var named []string // the open duplicate case's facts
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(f), '{}') FROM finance_cases, unnest(facts) f
		WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL`, sess.ID, CaseDuplicatePayment).Scan(&named); err != nil {
		return fmt.Errorf("late case: the open duplicate case: %w", err)
	}
	var late, dup []string
	for _, f := range facts {
		if slices.ContainsFunc(named, func(n string) bool { return factPayment(n) == factPayment(f) }) {
			dup = append(dup, f)
		} else {
			late = append(late, f)
		}
	}
	if len(dup) > 0 {
		if err := noteCase(ctx, tx, sess.ID, sess.OrderID, CaseDuplicatePayment, detail, now, dup...); err != nil {
			return err
		}
	}
	if len(late) == 0 && len(facts) > 0 {
		return nil
	}
	return noteCase(ctx, tx, sess.ID, sess.OrderID, CaseLatePayment, detail, now, late...)
}

// ApplyGatewayHint applies a gateway event (webhook) as a hint: the state applied is whatever
// the gateway says NOW about the payment, fetched, through the same path as Check. The session
// is found by the gateway payment id, or by our reference when the registration's answer (and
// so the id) was lost: then the event's payment, read by its id, is what is applied when it
// carries the session's reference (Check would search by reference, and a gateway's search may
// lag: Stripe's by up to an hour, and the event was marked applied with nothing applied, an
// outside review).
func (s *Service) ApplyGatewayHint(ctx context.Context, actor Actor, gatewayPaymentID, reference string) (Session, error) {
	return s.applyHint(ctx, actor, gatewayPaymentID, reference, nil)
}

// otherGatewaysPayment answers an event whose payment gatewayPaymentID (known, or read here)
// names by reference session id of gateway other as an unknown payment, and, unless that payment
// took nothing (declined, expired, reversed), opens a duplicate_gateway_payment case on the
// session: one session, a payment at each gateway. Not a gateway_mismatch case: a settlement of
// the old session by four eyes closes those, and this one is about other money (the session's own
// review).
func (s *Service) otherGatewaysPayment(ctx context.Context, id, orderID, other, gatewayPaymentID string, known *GatewayPayment) error {
	fact := gatewayPaymentID + " (at " + s.gw.Name() + ")"
	if known == nil {
		started := time.Now()
		gp, gerr := s.gw.Status(ctx, gatewayPaymentID)
		s.logGatewayCall(ctx, id, "status", "", started, gerr)
		switch {
		case gerr == nil:
			known = &gp
		case !gatewayNotFound(gerr):
			// Whether it took money is what holds the order's checkout (paymentInReviewSQL): a
			// fact without it held nothing, and the event was done with (unknown_payment) while
			// the customer could pay again (an outside review). The event waits for its retry.
			return eventUnanswered(gerr)
		}
	}
	if known != nil {
		fact = gatewayFact(*known) + " (at " + s.gw.Name() + ")"
	}
	switch {
	case known == nil || known.Reference != id:
		// The gateway does not know the payment, or its payment carries another reference: the
		// event's word alone (a hint) opened the case, and another shop's payment on a shared
		// account held this order's checkout (a review of answers about other things).
	case known.Status == GatewayDeclined || known.Status == GatewayExpired || known.Status == GatewayReversed:
	default:
		detail := fmt.Sprintf("gateway %s reports payment %s under this session's reference; the session was registered at gateway %s", s.gw.Name(), fact, other)
		if err := s.inTx(ctx, "hint: another gateway's session", func(tx pgx.Tx) error {
			// noteCase: its capture after a case about it pending is news (the checkout waits on
			// it: paymentInReviewSQL), a review of the session's diff found it dropped.
			return noteCase(ctx, tx, id, orderID, CaseDuplicatePayment, detail, s.cfg.Clock.Now(), fact)
		}); err != nil {
			return err
		}
	}
	return Errorf(ENOTFOUND, "no session of gateway %s for gateway payment %q (session %s is gateway %s's: a case for finance)", s.gw.Name(), gatewayPaymentID, id, other)
}

// applyHint is ApplyGatewayHint with the event's payment when the caller read it already (known).
func (s *Service) applyHint(ctx context.Context, actor Actor, gatewayPaymentID, reference string, known *GatewayPayment) (Session, error) {
	var id string
	byID := true
	err := s.db.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE gateway = $1 AND gateway_payment_id = $2`,
		s.gw.Name(), gatewayPaymentID).Scan(&id)
	// Our reference is the session id as we wrote it (lower case): a reference that only casts to
	// it ("3E58…") is another payment's, and found the session through the uuid cast (a review of
	// answers about other things).
	if err != nil && validUUID(reference) && reference == strings.ToLower(reference) {
		byID = false
		var gateway, orderID string
		err = s.db.QueryRow(ctx, `SELECT id::text, gateway, order_id FROM payment_sessions WHERE id = $1`, reference).Scan(&id, &gateway, &orderID)
		if err == nil && gateway != s.gw.Name() {
			// Another gateway's session (GATEWAY changed) is not this gateway's payment to
			// attach, Complete or Check (gwOf): the fallback attached the new gateway's payment
			// to an old session, and an event about such a session was retried every round for
			// ever (an outside review of the session's diff). Finance is told instead: the
			// customer may have paid at this gateway for it.
			return Session{}, s.otherGatewaysPayment(ctx, id, orderID, gateway, gatewayPaymentID, known)
		}
	}
	if err != nil {
		return Session{}, dbError("hint: find session", err, "no session for gateway payment %q", gatewayPaymentID)
	}
	if byID || gatewayPaymentID == "" {
		return s.Check(ctx, actor, id)
	}
	sess, err := s.Get(ctx, id)
	if err != nil {
		return Session{}, err
	}
	if sess.GatewayPaymentID != "" {
		return s.Check(ctx, actor, id) // attached to another payment meanwhile: Check judges it
	}
	gp := known
	if gp == nil {
		started := time.Now()
		got, gerr := s.gw.Status(ctx, gatewayPaymentID)
		s.logGatewayCall(ctx, sess.ID, "status", "", started, gerr)
		switch {
		case gatewayNotFound(gerr):
			return s.Check(ctx, actor, id)
		case gerr != nil:
			return sess, eventUnanswered(gerr)
		}
		gp = &got
	}
	if gp.Reference != sess.Reference() {
		return s.Check(ctx, actor, id)
	}
	return s.applyGatewayPayment(ctx, actor, sess, *gp, "the event's payment, read by its id")
}
