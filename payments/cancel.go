package payments

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Limits of one-time codes per payment (contract: "one-time code limits"). They are rows in
// PostgreSQL counted under the order → session locks, so every replica spends one budget:
//
//   - a new code replaces the earlier ones (they answer EEXPIRED, 410): asking again never
//     leaves several codes to guess at;
//   - at most CodeRequestsPerHour code requests per payment per hour (then ELOCKED, 429, with
//     Retry-After): a customer's phone is not flooded, and requests do not buy guesses;
//   - at most CodeGuessesPerDay wrong guesses per payment per 24 hours across all its codes
//     (then ELOCKED for everything code-confirmed on that payment, the right code included, until
//     the oldest guess is a day old; a staff member must act meanwhile).
const (
	CodeRequestsPerHour = 3
	CodeGuessesPerDay   = 10
)

// Challenge is a pending one-time cancel code. The code itself is only ever in the message to
// the customer (and in the outbox until it is delivered); the database keeps
// HMAC(secret, challenge id || code).
type Challenge struct {
	ID        string
	SessionID string
	ExpiresAt time.Time
}

// RequestCancel creates a one-time code for canceling a session and sends it to the customer.
// Refused (ECONFLICT) for Completed, Failed and Canceled sessions.
func (s *Service) RequestCancel(ctx context.Context, actor Actor, sessionID string) (Challenge, error) {
	ctx, span := s.startSpan(ctx, "payments.cancel.request", sessionID, "")
	defer span.End()
	sess, err := s.Get(ctx, sessionID)
	if err != nil {
		return Challenge{}, err
	}
	ctx = traceSession(ctx, sess)
	code, err := newCode()
	if err != nil {
		return Challenge{}, fmt.Errorf("request cancel: code: %w", err)
	}
	now := s.cfg.Clock.Now()
	ch := Challenge{ID: uuid.NewString(), SessionID: sessionID, ExpiresAt: now.Add(s.cfg.CodeTTL)}
	var msg Message
	var outboxID int64
	err = s.inTx(ctx, "request cancel", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sessionID)
		if err != nil {
			return err
		}
		if !cur.Status.Cancelable() && cur.Status != StatusCanceling {
			return Errorf(ECONFLICT, "a %s payment cannot be canceled", cur.Status)
		}
		if err := s.codeRequestAllowed(ctx, tx, sessionID, now); err != nil {
			return err
		}
		// The new code replaces every earlier one still open: only one code can be guessed at.
		if _, err := tx.Exec(ctx, `UPDATE cancel_challenges SET superseded_at = $2
			WHERE session_id = $1 AND consumed_at IS NULL AND superseded_at IS NULL`, sessionID, now); err != nil {
			return fmt.Errorf("request cancel: supersede: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO cancel_challenges (id, session_id, code_hash, expires_at, max_attempts, requested_by, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, ch.ID, sessionID, s.codeHash(ch.ID, code), ch.ExpiresAt,
			s.cfg.CodeAttempts, string(actor.Kind)+":"+actor.ID, now); err != nil {
			return fmt.Errorf("request cancel: insert: %w", err)
		}
		var contact string
		if err := tx.QueryRow(ctx, `SELECT coalesce(ps.customer_contact, o.customer_contact, '')
			FROM payment_sessions ps JOIN orders o USING (order_id) WHERE ps.id = $1`, sessionID).Scan(&contact); err != nil {
			return fmt.Errorf("request cancel: contact: %w", err)
		}
		text := func(code string) string {
			return fmt.Sprintf("Your code to cancel the payment of order %s is %s. It expires in %d minutes. Read it to the support agent only if you asked to cancel.",
				cur.OrderID, code, int(s.cfg.CodeTTL.Minutes()))
		}
		msg = Message{To: contact, Kind: "cancel_code", OrderID: cur.OrderID, PaymentID: sessionID,
			Text: text(code), Redacted: text(redactedCode), ChallengeID: ch.ID}
		outboxID, err = enqueue(ctx, tx, msg, now)
		return err
	})
	if err != nil {
		return Challenge{}, err
	}
	s.deliver(ctx, outboxID, msg)
	return ch, nil
}

// ConfirmResult is the outcome of ConfirmCancel. Replayed: the code had already been consumed by
// an earlier confirmation, and this one changed nothing.
type ConfirmResult struct {
	Session  Session
	Replayed bool
}

// ConfirmCancel consumes a one-time code and cancels the session (design.md, "The locking core"
// 3). In ONE transaction, under the order and session locks: check and consume the code (the
// attempt counter moves in the same UPDATE; hashes compared in constant time), check the session
// may be canceled, create the reverse operation (unique per session; its id is the gateway
// idempotency key) and move the session to Canceling. Only after commit is the gateway asked.
// The same code again finds the code consumed and the operation existing, and creates nothing.
func (s *Service) ConfirmCancel(ctx context.Context, actor Actor, sessionID, challengeID, code string) (ConfirmResult, error) {
	ctx, span := s.startSpan(ctx, "payments.cancel.confirm", sessionID, "")
	defer span.End()
	sess, err := s.Get(ctx, sessionID)
	if err != nil {
		return ConfirmResult{}, err
	}
	ctx = traceSession(ctx, sess)
	if !validUUID(challengeID) {
		return ConfirmResult{}, Invalid("challenge_id", "challenge_id is not a challenge of this payment")
	}
	// A malformed code is not rejected early: it is a wrong code and costs an attempt like one,
	// so probing the format tells an attacker nothing and buys nothing.
	now := s.cfg.Clock.Now()
	var (
		res   ConfirmResult
		wrong bool
		left  int
		// budgetSpent: this wrong guess used the payment's last one of the day
		budgetSpent bool
		opID        string
		newCancel   bool
	)
	err = s.inTx(ctx, "confirm cancel", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sessionID)
		if err != nil {
			return err
		}
		if h := s.cfg.Hooks.AfterCancelLock; h != nil {
			h(ctx, sessionID)
		}
		var (
			hash         []byte
			expiresAt    time.Time
			attempts     int
			maxAttempts  int
			consumedAt   *time.Time
			supersededAt *time.Time
		)
		err = tx.QueryRow(ctx, `SELECT code_hash, expires_at, attempts, max_attempts, consumed_at, superseded_at
			FROM cancel_challenges WHERE id = $1 AND session_id = $2 FOR UPDATE`, challengeID, sessionID).
			Scan(&hash, &expiresAt, &attempts, &maxAttempts, &consumedAt, &supersededAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return Errorf(ENOTFOUND, "challenge %s not found for this payment", challengeID)
		}
		if err != nil {
			return fmt.Errorf("confirm cancel: challenge: %w", err)
		}
		match := hmac.Equal(hash, s.codeHash(challengeID, code))
		if consumedAt != nil {
			if !match {
				return Errorf(EWRONG, "wrong code")
			}
			// The same code again: report what the first confirmation did, create nothing.
			res = ConfirmResult{Session: cur, Replayed: true}
			return nil
		}
		if supersededAt != nil {
			return Errorf(EEXPIRED, "a newer code was sent for this payment; only the latest one works")
		}
		if !expiresAt.After(now) {
			return Errorf(EEXPIRED, "the code has expired; request a new one")
		}
		// The payment's guess budget first: once it is spent, no code (not even the right one)
		// is tried, so guessing on and on never pays.
		guessesLeft, err := s.codeGuessesLeft(ctx, tx, sessionID, now)
		if err != nil {
			return err
		}
		if attempts >= maxAttempts {
			return Errorf(ELOCKED, "too many wrong codes; request a new one")
		}
		// Consume (or count a wrong attempt) in one guarded UPDATE. The FOR UPDATE above
		// already serialises confirmations of this challenge; the guard repeats the rules so
		// the UPDATE alone is correct too.
		var consumed bool
		err = tx.QueryRow(ctx, `UPDATE cancel_challenges
			SET attempts = attempts + 1, consumed_at = CASE WHEN $3 THEN $2::timestamptz END
			WHERE id = $1 AND consumed_at IS NULL AND attempts < max_attempts AND expires_at > $2
			RETURNING consumed_at IS NOT NULL, max_attempts - attempts`, challengeID, now, match).Scan(&consumed, &left)
		if err != nil {
			return fmt.Errorf("confirm cancel: consume: %w", err)
		}
		if !consumed {
			wrong = true
			if _, err := tx.Exec(ctx, `INSERT INTO code_wrong_guesses (session_id, challenge_id, created_at) VALUES ($1, $2, $3)`,
				sessionID, challengeID, now); err != nil {
				return fmt.Errorf("confirm cancel: count wrong guess: %w", err)
			}
			if guessesLeft-1 < left {
				left, budgetSpent = guessesLeft-1, guessesLeft-1 <= 0
			}
			return nil // commit the attempt
		}
		if !cur.Status.Cancelable() {
			if cur.Status == StatusCanceling {
				// Another challenge already started the cancel: nothing new to do.
				res = ConfirmResult{Session: cur, Replayed: true}
				return nil
			}
			return Errorf(ECONFLICT, "a %s payment cannot be canceled", cur.Status)
		}
		opID = uuid.NewString()
		if _, err := tx.Exec(ctx, `INSERT INTO reverse_operations (id, session_id, challenge_id, status, created_at, updated_at)
			VALUES ($1, $2, $3, 'Pending', $4, $4)`, opID, sessionID, challengeID, now); err != nil {
			return dbError("confirm cancel: reverse op", err, "")
		}
		next := now.Add(s.cfg.Backoff[0])
		updated, err := applyTransition(ctx, tx, sessionID, StatusCanceling, actor, "cancel confirmed with a one-time code", now, sessionPatch{nextCheckAt: &next})
		if err != nil {
			return err
		}
		res = ConfirmResult{Session: updated}
		newCancel = true
		return nil
	})
	if err != nil {
		return ConfirmResult{}, err
	}
	if wrong {
		if budgetSpent {
			return ConfirmResult{}, &Error{Code: EWRONG, Message: fmt.Sprintf("wrong code; that was the %dth wrong code for this payment today: codes are locked, a staff member can help", CodeGuessesPerDay)}
		}
		if left <= 0 {
			return ConfirmResult{}, &Error{Code: EWRONG, Message: "wrong code; no attempts left, request a new one"}
		}
		return ConfirmResult{}, &Error{Code: EWRONG, Message: fmt.Sprintf("wrong code; %d attempts left", left)}
	}
	if !newCancel {
		return res, nil
	}
	sessAfter, err := s.driveReverse(ctx, actor, res.Session)
	if err != nil {
		// The cancel is committed; the sweeper finishes the reverse. Report the state as it is.
		s.log.Warn("reverse after confirm", "session", sessionID, "err", err)
		sessAfter, err = s.Get(context.WithoutCancel(ctx), sessionID)
		if err != nil {
			return ConfirmResult{}, err
		}
	}
	res.Session = sessAfter
	return res, nil
}

// driveReverse asks the gateway to reverse a Canceling session with its reverse operation's id
// as the idempotency key, and applies the answer: reversed → Canceled; not reversible because it
// succeeded → Completed (the payment won the race) and a finance case; no answer → it stays
// Canceling for the sweeper, which repeats this with the same key.
func (s *Service) driveReverse(ctx context.Context, actor Actor, sess Session) (Session, error) {
	ctx, span := s.startSpan(ctx, "payments.cancel.reverse", sess.ID, sess.OrderID)
	defer span.End()
	var opID string
	if err := s.db.QueryRow(ctx, `SELECT id::text FROM reverse_operations WHERE session_id = $1`, sess.ID).Scan(&opID); err != nil {
		return sess, dbError("reverse: operation", err, "no reverse operation for payment %s", sess.ID)
	}
	if sess.GatewayPaymentID == "" {
		// The registration's answer was lost: find the payment by our reference first.
		gp, found, err := s.gatewayState(ctx, sess)
		if err != nil {
			return sess, err
		}
		if !found {
			// Nothing exists at the gateway: nothing to reverse. A payment that appears later
			// anyway becomes a late-payment case, never a silent charge.
			return s.finishCancelNoPayment(ctx, actor, sess)
		}
		if sess, err = s.applyGatewayPayment(ctx, actor, sess, gp, "found by reference while canceling"); err != nil {
			return sess, err
		}
		if sess.Status != StatusCanceling || sess.GatewayPaymentID == "" {
			return sess, nil
		}
	}
	started := time.Now()
	gp, err := s.gw.Reverse(ctx, sess.GatewayPaymentID, opID)
	s.logGatewayCall(ctx, sess.ID, "reverse", opID, started, err)
	if err == nil {
		return s.applyGatewayPayment(ctx, actor, sess, gp, "gateway reversed the payment")
	}
	if FailureOf(err) == FailureDefinitive {
		// Not reversible: ask what it is now and apply that (succeeded → Completed + case,
		// declined/expired → Failed). The operation is refused either way.
		cur, found, serr := s.gatewayState(ctx, sess)
		if serr != nil {
			return sess, serr
		}
		if _, xerr := s.db.Exec(context.WithoutCancel(ctx), `UPDATE reverse_operations SET status = 'Refused', detail = $2, updated_at = $3
			WHERE id = $1 AND status = 'Pending'`, opID, err.Error(), s.cfg.Clock.Now()); xerr != nil {
			return sess, fmt.Errorf("reverse: refuse op: %w", xerr)
		}
		if !found {
			return sess, err
		}
		return s.applyGatewayPayment(ctx, actor, sess, cur, "reverse refused: "+GatewayErrorCode(err))
	}
	return sess, err
}

func (s *Service) finishCancelNoPayment(ctx context.Context, actor Actor, sess Session) (Session, error) {
	ctx = context.WithoutCancel(ctx)
	now := s.cfg.Clock.Now()
	var out Session
	err := s.inTx(ctx, "cancel: no gateway payment", func(tx pgx.Tx) error {
		cur, err := lockOrderAndSession(ctx, tx, sess.OrderID, sess.ID)
		if err != nil {
			return err
		}
		if cur.Status != StatusCanceling {
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

// redactedCode stands for the code in the outbox once the message was delivered.
const redactedCode = "••••••"

// codeRequestAllowed enforces the per-payment limits on asking for a new code, in the caller's
// transaction under the order → session locks (so two replicas cannot both take the last
// request): at most CodeRequestsPerHour challenges created within the hour before now, and none
// while the payment's guess budget is spent. ELOCKED carries when asking makes sense again.
func (s *Service) codeRequestAllowed(ctx context.Context, tx pgx.Tx, sessionID string, now time.Time) error {
	var n int
	var oldest *time.Time
	if err := tx.QueryRow(ctx, `SELECT count(*), min(created_at) FROM cancel_challenges
		WHERE session_id = $1 AND created_at > $2`, sessionID, now.Add(-time.Hour)).Scan(&n, &oldest); err != nil {
		return fmt.Errorf("request cancel: count requests: %w", err)
	}
	if n >= CodeRequestsPerHour {
		wait := oldest.Add(time.Hour).Sub(now)
		return &Error{Code: ELOCKED, RetryAfter: wait,
			Message: fmt.Sprintf("at most %d codes per payment per hour were sent already; ask again in %s", CodeRequestsPerHour, roundUp(wait))}
	}
	_, err := s.codeGuessesLeft(ctx, tx, sessionID, now)
	return err
}

// codeGuessesLeft returns how many wrong guesses the payment may still make within the 24 hours
// before now, or ELOCKED (with when the oldest counted guess lapses) when none. The caller holds
// the order → session locks and writes its own wrong guess in the same transaction.
func (s *Service) codeGuessesLeft(ctx context.Context, tx pgx.Tx, sessionID string, now time.Time) (int, error) {
	var n int
	var oldest *time.Time
	if err := tx.QueryRow(ctx, `SELECT count(*), min(created_at) FROM code_wrong_guesses
		WHERE session_id = $1 AND created_at > $2`, sessionID, now.Add(-24*time.Hour)).Scan(&n, &oldest); err != nil {
		return 0, fmt.Errorf("one-time code: count wrong guesses: %w", err)
	}
	if n >= CodeGuessesPerDay {
		wait := oldest.Add(24 * time.Hour).Sub(now)
		return 0, &Error{Code: ELOCKED, RetryAfter: wait,
			Message: fmt.Sprintf("%d wrong codes for this payment within a day: codes are locked for %s; a staff member can help meanwhile", CodeGuessesPerDay, roundUp(wait))}
	}
	return CodeGuessesPerDay - n, nil
}

// roundUp writes a wait for people: whole minutes, at least one.
func roundUp(d time.Duration) time.Duration {
	return max(d.Round(time.Minute), time.Minute)
}

// codeHash is HMAC-SHA256(secret, challenge id || 0 || code): a keyed hash, so a database dump
// does not reveal codes, and bound to the challenge, so equal codes hash differently.
func (s *Service) codeHash(challengeID, code string) []byte {
	m := hmac.New(sha256.New, s.cfg.CodeSecret)
	m.Write([]byte(challengeID))
	m.Write([]byte{0})
	m.Write([]byte(code))
	return m.Sum(nil)
}

// newCode returns a uniformly random 6-digit code from crypto/rand.
func newCode() (string, error) {
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%06d", n.Int64()), nil
}
