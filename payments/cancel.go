package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// RequestCancel creates a one-time code for canceling a session and sends it to the customer
// (code.go: the per-payment code limits). Refused (ECONFLICT) for Completed, Failed and
// Canceled sessions.
func (s *Service) RequestCancel(ctx context.Context, actor Actor, sessionID string) (Challenge, error) {
	return s.requestCancel(ctx, actor, sessionID, "")
}

// RequestCancelOnce is RequestCancel for a form with an intent key (the console's "Request
// cancel", a UUID per page): the same form sent again while its code is still open answers that
// code and sends nothing. A double click sent the customer two codes, the first dead on arrival,
// and spent two of the payment's three code requests of the hour (an outside review). A form
// without a key (a page of the release before, during a rolling deploy) is RequestCancel, as that
// release answered it; a damaged key is refused.
func (s *Service) RequestCancelOnce(ctx context.Context, actor Actor, sessionID, intent string) (Challenge, error) {
	if intent == "" {
		return s.requestCancel(ctx, actor, sessionID, "")
	}
	if !validUUID(intent) {
		return Challenge{}, Invalid("intent", "the cancel form is damaged; reload the page")
	}
	return s.requestCancel(ctx, actor, sessionID, "console/"+intent)
}

func (s *Service) requestCancel(ctx context.Context, actor Actor, sessionID, requestKey string) (Challenge, error) {
	ctx, span := s.startSpan(ctx, "payments.cancel.request", sessionID, "")
	defer span.End()
	sess, err := s.Get(ctx, sessionID)
	if err != nil {
		return Challenge{}, err
	}
	ctx = s.traceSession(ctx, sess)
	var ch Challenge
	var queued queuedMessage
	err = s.inTx(ctx, "request cancel", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sessionID)
		if err != nil {
			return err
		}
		// Read once the locks are held: a code lives its CodeTTL from its issue, not from before a
		// wait for them (as tryCode judges one: TestACodeIsJudgedWhenItsLocksAreHeld).
		now := s.cfg.Clock.Now()
		// A Canceling payment's cancel was confirmed already: a new code would reach the customer
		// for nothing and spend one of the payment's code requests.
		if cur.Status == StatusCanceling {
			return Errorf(ECONFLICT, "the cancel of this payment is already under way (Canceling): no new code was sent")
		}
		if !cur.Status.Cancelable() {
			return Errorf(ECONFLICT, "a %s payment cannot be canceled", cur.Status)
		}
		if refusal, err := mismatchRefusal(ctx, tx, cur); err != nil {
			return err
		} else if refusal != nil {
			return refusal
		}
		if requestKey != "" {
			if ch, err = openChallengeOf(ctx, tx, cur.ID, CodeCancel, requestKey, 0, now, s.cfg.Notifier != nil); err != nil || ch.ID != "" {
				return err // the form's code is still open: no second message
			}
		}
		ch, queued, err = s.issueCode(ctx, tx, cur, actor, codeRequest{action: CodeCancel, kind: "cancel_code", requestKey: requestKey,
			text: func(code string) string {
				return fmt.Sprintf("Your code to cancel the payment of order %s is %s. %s Read it to the support agent only if you asked to cancel.",
					cur.OrderID, code, codeExpiry(s.cfg.CodeTTL))
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

// ConfirmResult is the outcome of ConfirmCancel. Replayed: the code had already been consumed by
// an earlier confirmation, and this one changed nothing.
type ConfirmResult struct {
	Session  Session
	Replayed bool
}

// ConfirmCancel consumes a one-time code and cancels the session (design.md, "The locking core"
// 3). In ONE transaction, under the order and session locks: check and consume the code
// (tryCode), check the session may be canceled, create the reverse operation (unique per
// session; its id is the gateway idempotency key) and move the session to Canceling. Only after
// commit is the gateway asked. The same code again finds the code consumed and the operation
// existing, and creates nothing.
func (s *Service) ConfirmCancel(ctx context.Context, actor Actor, sessionID, challengeID, code string) (ConfirmResult, error) {
	ctx, span := s.startSpan(ctx, "payments.cancel.confirm", sessionID, "")
	defer span.End()
	sess, err := s.Get(ctx, sessionID)
	if err != nil {
		return ConfirmResult{}, err
	}
	sessionID = sess.ID // as stored: the audit's target, as the payment's page looks it up
	ctx = s.traceSession(ctx, sess)
	began := time.Now() // the drive's deadline is counted from here, before any lock wait (cancelGrace)
	var (
		res       ConfirmResult
		wrong     error
		newCancel bool
		patrols   bool // the reverse is the patrol's alone: a registration may be on its way
	)
	err = s.inTx(ctx, "confirm cancel", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sessionID)
		if err != nil {
			return err
		}
		// The clock is read once the locks are held: a code is judged at the moment it is
		// spent, not when its request began waiting for a lock (up to lock_timeout earlier).
		now := s.cfg.Clock.Now()
		if h := s.cfg.Hooks.AfterCancelLock; h != nil {
			h(ctx, sessionID)
		}
		// A payment with nothing left to cancel refuses every code as that (conflict) and
		// spends no guess of the payment's budget on it: guessing at a finished payment buys
		// nothing. A dead challenge still answers as dead, and the code that canceled it replays.
		var refusal *Error
		if !cur.Status.Cancelable() && cur.Status != StatusCanceling {
			refusal = Errorf(ECONFLICT, "a %s payment cannot be canceled", cur.Status)
		} else if cur.Status != StatusCanceling {
			if refusal, err = mismatchRefusal(ctx, tx, cur); err != nil {
				return err
			}
		}
		try, err := s.tryCode(ctx, tx, sessionID, challengeID, CodeCancel, code, now, refusal, actor)
		switch {
		case err != nil:
			return err
		case try.Wrong != nil:
			wrong = try.Wrong
			return nil // commit the attempt
		case try.Replayed:
			if err := lostRace(cur); err != nil {
				return err // the cancel this code confirmed lost its race: the same answer again
			}
			res = ConfirmResult{Session: cur, Replayed: true}
			return nil
		}
		if cur.Status == StatusCanceling {
			// Another challenge already started the cancel: nothing new to do.
			res = ConfirmResult{Session: cur, Replayed: true}
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO reverse_operations (id, session_id, challenge_id, status, created_at, updated_at)
			VALUES ($1, $2, $3, 'Pending', $4, $4)`, uuid.NewString(), sessionID, challengeID, now); err != nil {
			return dbError("confirm cancel: reverse op", err, "")
		}
		// The reverse goes from here right after the commit: the patrol's first look waits
		// until it can no longer be in flight (RegisterGrace, as for a Registering session),
		// or another replica sends the same reverse beside it.
		next := now.Add(s.cancelGrace())
		// A registration may be on its way to the gateway — Create's own (Registering), or a
		// patrol drive's under the lease cleared below — and the drive after the commit, finding
		// nothing by reference yet, would register beside it: with a gateway that ignores keys,
		// a second payment (an outside review). The patrol sends the reverse once that is over
		// (a drive ends its calls before its lease does).
		if cur.GatewayPaymentID == "" {
			// Or one sent and cut (the replica's stop, its own timeout) that the gateway may still
			// be processing: RegisterGrace from when it was given up (registrationInFlight; a
			// cancel inside a cut Create's grace registered beside it, an outside review).
			inFlight, err := registrationInFlight(ctx, tx, cur.ID, now, s.cfg.RegisterGrace)
			if err != nil {
				return err
			}
			if cur.Status == StatusRegistering || cur.LeaseUntil != nil && cur.LeaseUntil.After(now) || inFlight.After(now) {
				patrols = true
				if cur.LeaseUntil != nil && cur.LeaseUntil.After(next) {
					next = *cur.LeaseUntil
				}
				if inFlight.After(next) {
					next = inFlight
				}
			}
		}
		// The reverse is new work with a schedule of its own: it starts from the first step,
		// not from the looks the payment's check used up (an Unknown payment near the end of
		// its schedule would otherwise get one look a day later and be flagged), and a flag
		// the payment carried is cleared, or the patrol (which claims no flagged row) would
		// never send again a reverse that found no answer. An open finance case stays open.
		// A patrol drive in flight (a check) loses its lease here: its release would count its
		// look against the reverse's fresh schedule (one send fewer before the flag), and its
		// answer is the reverse's to find now, so it writes nothing more
		// (TestACancelConfirmedUnderADriveKeepsItsWholeSchedule).
		reason, detail := "cancel confirmed with a one-time code", "challenge "+challengeID+": now Canceling (the reverse goes to the gateway after commit)"
		if cur.FlaggedAt != nil {
			cleared := "; flag cleared (" + cur.FlagReason + "): the patrol sends the reverse until it is settled"
			reason, detail = reason+cleared, detail+cleared
		}
		if _, err := tx.Exec(ctx, `UPDATE payment_sessions SET flagged_at = NULL, flag_reason = NULL, check_attempts = 0,
			lease_owner = NULL, lease_until = NULL, lease_token = NULL WHERE id = $1`, sessionID); err != nil {
			return dbError("confirm cancel: schedule", err, "")
		}
		updated, err := applyTransition(ctx, tx, sessionID, StatusCanceling, actor, reason, now, sessionPatch{nextCheckAt: &next})
		if err != nil {
			return err
		}
		if err := auditStaff(ctx, tx, actor, AuditCancelConfirm, sessionID, detail, now); err != nil {
			return err
		}
		res = ConfirmResult{Session: updated}
		newCancel = true
		return nil
	})
	if err != nil {
		return ConfirmResult{}, err
	}
	if wrong != nil {
		return ConfirmResult{}, wrong
	}
	if !newCancel || patrols {
		return res, nil
	}
	// The drive after the commit ends a gateway timeout before the patrol's first look may come
	// (a lock wait before the commit ate into it; the drive may ask the gateway up to four
	// times): what it has not finished by then is the patrol's, never done beside it.
	deadline := began.Add(s.cancelGrace() - s.cfg.GatewayTimeout)
	if h := s.cfg.Hooks.AfterCancelCommit; h != nil {
		h(ctx, sessionID)
	}
	if time.Until(deadline) <= 0 {
		return res, nil // Canceling: the patrol sends the reverse
	}
	dctx, stop := context.WithDeadline(ctx, deadline)
	defer stop()
	sessAfter, err := s.driveReverse(dctx, actor, res.Session)
	if err != nil {
		// The cancel is committed; the sweeper finishes the reverse. Report the state as it is.
		s.log.Warn("reverse after confirm", "session", sessionID, "err", err)
		gctx, done := s.detachRecord(ctx)
		defer done()
		sessAfter, err = s.Get(gctx, sessionID)
		if err != nil {
			return ConfirmResult{}, err
		}
	}
	res.Session = sessAfter
	return res, lostRace(sessAfter)
}

// mismatchRefusal is the refusal of a cancel of cur while the gateway's word about it does not
// match it: an open gateway_mismatch case (it holds a payment for another amount or currency, or
// answered with another payment), or — the payment flagged — any such case, even one finance
// resolved without settling it (a flag keeps its first reason, so which one raised it cannot be
// told). What a reverse would void is not the session's, its answer could never be applied (the
// same mismatch, and silently once resolved), and a capture before it was answered 202
// "Canceling" with the money taken and the cancel never finished (an outside review, cancels;
// and two reviews of the rule). Finance settles the payment (four eyes); no code is sent, none
// is spent.
func mismatchRefusal(ctx context.Context, tx pgx.Tx, cur Session) (*Error, error) {
	mismatch, err := contradicted(ctx, tx, cur)
	if err != nil || !mismatch {
		return nil, err
	}
	return Errorf(ECONFLICT, "payment %s is with finance: the gateway's answer about it does not match it (a gateway_mismatch case, and the payment is not settled), so it cannot be canceled here; finance settles it. Nothing was canceled", Short(cur.ID)), nil
}

// contradicted: mismatchRefusal's rule — an open gateway_mismatch case of cur, or, cur flagged,
// any — which the payment page reads too (PaymentDetail.CancelRefused: it offers no cancel the
// core would refuse).
func contradicted(ctx context.Context, q querier, cur Session) (bool, error) {
	var mismatch bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM finance_cases WHERE session_id = $1 AND kind = $2
			AND (resolved_at IS NULL OR $3))`, cur.ID, CaseGatewayMismatch, cur.FlaggedAt != nil).Scan(&mismatch); err != nil {
		return false, fmt.Errorf("cancel: the gateway's word: %w", err)
	}
	return mismatch, nil
}

// cancelGrace is how long after a confirmed cancel the patrol first looks at it: its reverse
// goes out right after the commit and must not be sent beside it (RegisterGrace, as for a
// Registering session, or the schedule's first step when that is longer). ConfirmCancel's own
// drive ends a gateway timeout before it.
func (s *Service) cancelGrace() time.Duration { return max(s.cfg.Backoff[0], s.cfg.RegisterGrace) }

// lostRace is the refusal of a cancel whose reverse found the payment already finished at the
// gateway (driveReverse applied what it is): nothing was canceled, so the answer is the one for a
// payment that cannot be canceled, not an accepted cancel.
func lostRace(sess Session) error {
	switch sess.Status {
	case StatusCompleted:
		return Errorf(ECONFLICT, "the customer's payment was captured before the cancel reached the gateway: it cannot be canceled (finance has a case to refund it if it must be undone)")
	case StatusFailed:
		return Errorf(ECONFLICT, "the payment had already failed at the gateway: there was nothing to cancel")
	}
	return nil
}

// driveReverse asks the gateway to reverse a Canceling session with its reverse operation's id
// as the idempotency key, and applies the answer: reversed → Canceled; not reversible because it
// succeeded → Completed (the payment won the race) and a finance case; no answer → it stays
// Canceling for the sweeper, which repeats this with the same key. A refusal while the payment
// can still be reversed (pending or authorized at the gateway: a 400, a proxy's 404) is not
// the end of the customer's cancel: the operation stays Pending and the patrol sends it again
// with the same key, until its schedule runs out and the session is flagged for finance.
func (s *Service) driveReverse(ctx context.Context, actor Actor, sess Session) (Session, error) {
	ctx, span := s.startSpan(ctx, "payments.cancel.reverse", sess.ID, sess.OrderID)
	defer span.End()
	// The operation, and whether there is still a reverse to send: a check or a webhook may
	// have applied the gateway's "succeeded" since the cancel committed (ConfirmCancel drives
	// without a lease), and no reverse is sent for a payment we already call Completed.
	var opID, opStatus string
	var status Status
	if err := s.db.QueryRow(ctx, `SELECT r.id::text, r.status, s.status FROM reverse_operations r
		JOIN payment_sessions s ON s.id = r.session_id WHERE r.session_id = $1`, sess.ID).Scan(&opID, &opStatus, &status); err != nil {
		return sess, dbError("reverse: operation", err, "no reverse operation for payment %s", sess.ID)
	}
	if status != StatusCanceling || opStatus != "Pending" {
		return s.Get(ctx, sess.ID)
	}
	if sess.GatewayPaymentID == "" {
		// The registration's answer was lost: find the payment by our reference first.
		gp, found, err := s.gatewayState(ctx, sess)
		if err != nil {
			return sess, err
		}
		held := !found // the registration below holds first; a payment found, the reverse after it
		if !found {
			// Nothing found by our reference — but our own registration may still be on its
			// way (the gateway acting on a request whose answer never came, or still working
			// on it), and an empty search is not the gateway's word. Ask under the session's
			// own key: the payment in flight (or one this creates) comes back and is reversed
			// below; an unknown answer (the first request still in use, a 5xx) leaves the session
			// Canceling for the patrol, which asks again; only a refusal says nothing exists.
			// A patrol drive whose lease ran out during the look-up sends nothing: the replica
			// holding it now looks and registers itself, and a gateway that ignores keys would
			// make a second payment (TestALeaseLostDuringTheLookUpRegistersNothing).
			if err := s.holdForSend(ctx, sess); err != nil {
				return sess, err
			}
			gp, err = s.registerAgain(ctx, sess) // holds the session when its answer never came
			switch {
			case err == nil:
			case FailureOf(err) == FailureDefinitive:
				// Refused: nothing exists at the gateway, nothing to reverse. A payment that
				// appears later anyway becomes a late-payment case, never a silent charge.
				return s.finishCancelNoPayment(ctx, actor, sess)
			default:
				return sess, err
			}
		}
		if sess, err = s.applyGatewayPayment(ctx, actor, sess, gp, "found by reference while canceling"); err != nil {
			return sess, err
		}
		if sess.Status != StatusCanceling || sess.GatewayPaymentID == "" {
			return sess, nil
		}
		if !held {
			// The drive held nothing before the look-up (drive): the reverse's hold.
			if err := s.holdForSend(ctx, sess); err != nil {
				return sess, err
			}
		}
	}
	started := time.Now()
	gp, err := s.gwOf(sess).Reverse(ctx, sess.GatewayPaymentID, opID)
	s.logGatewayCall(ctx, sess.ID, "reverse", opID, started, err)
	if err == nil {
		return s.applyGatewayPayment(ctx, actor, sess, gp, "gateway reversed the payment")
	}
	if FailureOf(err) == FailureDefinitive {
		// Refused: ask what the payment is now. Final (succeeded → Completed + case,
		// declined/expired → Failed): the operation is refused, and the answer applied.
		// Reversed after all (another of our requests got through): applied, Canceled.
		cur, found, serr := s.gatewayState(ctx, sess)
		if serr != nil {
			return sess, serr
		}
		if !found || !reverseRefusalFinal(cur.Status) {
			// Still pending or authorized, or not found by its id: the money may be held and
			// the customer's cancel stands. The operation stays Pending for the patrol.
			return sess, fmt.Errorf("reverse refused while the payment is %q at the gateway; the patrol sends it again: %w", cur.Status, err)
		}
		// The operation ends with the answer's apply, in its transaction under the locks:
		// Refused when the payment was captured first (a lost race, with its case), done with
		// nothing to reverse when it was declined or expired, done when reversed after all.
		return s.applyGatewayPayment(ctx, actor, sess, cur, "reverse refused: "+GatewayErrorCode(err))
	}
	return sess, err
}

// reverseRefusalFinal says whether a refused reverse ends the cancel: the gateway's payment is
// final (succeeded, declined, expired, reversed), so there is nothing left to reverse.
func reverseRefusalFinal(st GatewayStatus) bool {
	switch st {
	case GatewaySucceeded, GatewayDeclined, GatewayExpired, GatewayReversed:
		return true
	}
	return false
}

func (s *Service) finishCancelNoPayment(ctx context.Context, actor Actor, sess Session) (Session, error) {
	ctx, done := s.detachRecord(ctx)
	defer done()
	now := s.cfg.Clock.Now()
	var out Session
	err := s.inTx(ctx, "cancel: no gateway payment", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
		if err != nil {
			return err
		}
		if cur.Status != StatusCanceling || cur.GatewayPaymentID != "" {
			// Settled meanwhile, or its gateway payment was found meanwhile (a Check, a
			// webhook): the refusal the caller read was not the last word, and the patrol
			// reverses the payment the session now names.
			out = cur
			return nil
		}
		out, err = applyTransition(ctx, tx, sess.ID, StatusCanceled, actor, "canceled: the gateway has no payment for this session", now, sessionPatch{})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE reverse_operations SET status = 'Succeeded', detail = 'nothing to reverse', updated_at = $2
			WHERE session_id = $1 AND status = 'Pending'`, sess.ID, now)
		return err
	})
	return out, err
}
