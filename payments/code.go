package payments

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// One-time codes confirm what a customer must agree to: a cancel, a refund support starts
// (contract: "one-time code limits (cancel, and any later code-confirmed action)"). Each action
// issues its code with issueCode and spends it with tryCode, both in the action's own
// transaction under the order → session locks, so the limits below are one budget per payment
// whatever the action, and every replica spends the same one:
//
//   - a new code replaces the earlier ones (they answer EEXPIRED, 410): asking again never
//     leaves several codes to guess at;
//   - at most CodeRequestsPerHour code requests per payment per hour (then ELOCKED, 429, with
//     Retry-After): a customer's phone is not flooded, and requests do not buy guesses;
//   - optionally (Config.CodeRequestsPerContact), at most that many codes per customer contact
//     per hour across all its payments (then ELOCKED with Retry-After): many payments naming one
//     contact (a shop's API key in the wrong hands, a careless support user) do not make pitlane
//     text one phone without end. The contact is read as one recipient (pitlane_contact_key:
//     spaces and a phone number's punctuation do not make a new one). Counted under a lock of
//     the contact (LockCodeContact), taken after the order → session locks and by nothing else,
//     so two payments of one contact cannot both take the last code;
//   - at most CodeGuessesPerDay wrong guesses per payment per 24 hours across all its codes
//     (then ELOCKED for everything code-confirmed on that payment, the right code included, until
//     the oldest guess is a day old, or a finance or admin user unlocks them: UnlockCodes).
const (
	CodeRequestsPerHour = 3
	CodeGuessesPerDay   = 10
)

// CodeAction is what a one-time code confirms.
type CodeAction string

const (
	CodeCancel CodeAction = "cancel"
	CodeRefund CodeAction = "refund"
)

// Challenge is a pending one-time code. The code itself is only ever in the message to the
// customer (and in the outbox until it is delivered); the database keeps
// HMAC(secret, challenge id || code).
type Challenge struct {
	ID        string
	SessionID string
	Action    CodeAction
	Amount    int64 // refund: the amount the code confirms
	ExpiresAt time.Time
	// Reused: the form's code was still open and is answered again; no message was sent.
	Reused bool
	// Undelivered is why the code's message has not reached NOTIFY_WEBHOOK_URL yet (the
	// notifier refused it, or did not answer in time): the patrol tries again. "" when the
	// notifier took it, or when there is none (the outbox is the channel).
	Undelivered string
}

// codeRequest is a new code about to be sent: what it confirms and the message that carries it.
type codeRequest struct {
	action CodeAction
	// amount and requestKey: what a refund's code confirms, and the console form's intent key.
	amount     int64
	requestKey string
	// kind is the outbox message kind; text writes the message around a code (the real one, or
	// the redacted one the outbox keeps after delivery).
	kind string
	text func(code string) string
}

// codeChallenge is a challenge row as tryCode returns it to the action.
type codeChallenge struct {
	ID         string
	Amount     int64
	RequestKey string
}

// codeAttempt is what tryCode found. Replayed: the code had been consumed already by the same
// code, and the action should report what that first confirmation did. Wrong: a wrong guess was
// counted; the caller must COMMIT (the guess is spent) and then return Wrong.
type codeAttempt struct {
	Challenge codeChallenge
	Replayed  bool
	Wrong     error
}

// issueCode makes a new code for the session cur, locked by the caller together with its order,
// in the caller's transaction: the limits, the earlier codes superseded, the challenge and the
// message to the customer in the outbox. The caller delivers the message after commit
// (s.deliver with the returned outbox id).
func (s *Service) issueCode(ctx context.Context, tx pgx.Tx, cur Session, actor Actor, req codeRequest, now time.Time) (Challenge, queuedMessage, error) {
	// The contact, and the recipient it names (pitlane_contact_key) when codes per contact are
	// bounded; '' (no bound) for a contact that names nobody ("-", spaces).
	var contact, recipient string
	if err := tx.QueryRow(ctx, `SELECT c, CASE WHEN $2 THEN coalesce(pitlane_contact_key(c), '') ELSE '' END
		FROM (SELECT coalesce(ps.customer_contact, o.customer_contact, '') AS c
			FROM payment_sessions ps JOIN orders o USING (order_id) WHERE ps.id = $1) AS contact`,
		cur.ID, s.cfg.CodeRequestsPerContact > 0).Scan(&contact, &recipient); err != nil {
		return Challenge{}, queuedMessage{}, fmt.Errorf("one-time code: contact: %w", err)
	}
	if recipient != "" {
		// The contact's lock may wait for another payment's code request: the code's life runs
		// from when it is issued, after the wait (TestACancelCodeLivesItsTTLFromItsIssue).
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(LockCodeContact), recipient); err != nil {
			return Challenge{}, queuedMessage{}, dbError("one-time code: lock the contact", err, "")
		}
		now = s.cfg.Clock.Now()
	}
	if err := s.codeRequestAllowed(ctx, tx, cur.ID, recipient, now); err != nil {
		return Challenge{}, queuedMessage{}, err
	}
	code, err := newCode()
	if err != nil {
		return Challenge{}, queuedMessage{}, fmt.Errorf("one-time code: %w", err)
	}
	ch := Challenge{ID: uuid.NewString(), SessionID: cur.ID, Action: req.action, Amount: req.amount, ExpiresAt: now.Add(s.cfg.CodeTTL)}
	// The new code replaces every earlier one still open: only one code can be guessed at.
	if _, err := tx.Exec(ctx, `UPDATE cancel_challenges SET superseded_at = $2
		WHERE session_id = $1 AND consumed_at IS NULL AND superseded_at IS NULL`, cur.ID, now); err != nil {
		return Challenge{}, queuedMessage{}, fmt.Errorf("one-time code: supersede: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO cancel_challenges (id, session_id, action, amount, request_key, code_hash, expires_at, max_attempts, requested_by, created_at)
		VALUES ($1, $2, $3, nullif($4, 0), nullif($5, ''), $6, $7, $8, $9, $10)`, ch.ID, cur.ID, string(req.action), req.amount, req.requestKey,
		s.codeHash(ch.ID, code), ch.ExpiresAt, s.cfg.CodeAttempts, string(actor.Kind)+":"+actor.ID, now); err != nil {
		return Challenge{}, queuedMessage{}, dbError("one-time code: insert", err, "")
	}
	msg := Message{To: contact, Kind: req.kind, OrderID: cur.OrderID, PaymentID: cur.ID, Text: req.text(code), Redacted: req.text(redactedCode),
		ChallengeID: ch.ID}
	var leaseUntil time.Time
	if s.cfg.Notifier != nil {
		// The writer delivers it after commit, within its lease less writerRecordTime: the
		// sessions' lease (6 × GATEWAY_TIMEOUT), but never less than one notifier POST and its
		// record. Under a GATEWAY_TIMEOUT of about 0.34 s (10 ms is allowed) no time was left to
		// send at all, and the code waited for the patrol's grace (a review of config extremes).
		leaseUntil = now.Add(max(s.cfg.LeaseDuration, NotifierTimeout+writerRecordTime))
	}
	queued, err := enqueue(ctx, tx, msg, now, leaseUntil)
	if err != nil {
		return Challenge{}, queuedMessage{}, err
	}
	return ch, queued, nil
}

// openChallengeOf is the challenge a form's intent key (requestKey) already got on the session,
// while its code may still be tried: the same form sent again answers it and sends nothing.
// Zero when there is none. With a notifier (notifying), its Undelivered says why its message
// still waits for the patrol: the notifier's last refusal, or a first try cut short (the request
// that wrote it ended while sending: the form is sent again after an error page, and the answer
// said nothing of it; an outside review). A message whose writer may still be sending it (its
// lease live: a double click) is not called undelivered.
func openChallengeOf(ctx context.Context, tx pgx.Tx, sessionID string, action CodeAction, requestKey string, amount int64, now time.Time, notifying bool) (Challenge, error) {
	ch := Challenge{SessionID: sessionID, Action: action, Amount: amount, Reused: true}
	err := tx.QueryRow(ctx, `SELECT c.id::text, c.expires_at,
			CASE WHEN NOT $6 OR o.id IS NULL THEN ''
			     WHEN o.last_error IS NOT NULL THEN o.last_error
			     WHEN o.lease_until IS NULL OR o.lease_until <= $5 THEN 'its first try was cut short'
			     ELSE '' END
		FROM cancel_challenges c
		LEFT JOIN LATERAL (SELECT id, last_error, lease_until FROM outbox -- through outbox_payment (00870)
			WHERE payment_id = c.session_id AND challenge_id = c.id AND delivered_at IS NULL AND skipped_at IS NULL
			ORDER BY id DESC LIMIT 1) o ON true
		WHERE c.session_id = $1 AND c.action = $2 AND c.request_key = $3 AND c.amount IS NOT DISTINCT FROM nullif($4, 0)
		  AND c.consumed_at IS NULL AND c.superseded_at IS NULL AND c.expires_at > $5 AND c.attempts < c.max_attempts`,
		sessionID, string(action), requestKey, amount, now, notifying).Scan(&ch.ID, &ch.ExpiresAt, &ch.Undelivered)
	if errors.Is(err, pgx.ErrNoRows) {
		return Challenge{}, nil
	}
	if err != nil {
		return Challenge{}, fmt.Errorf("one-time code: the form's open code: %w", err)
	}
	return ch, nil
}

// tryCode checks code against the challenge of action on the session and consumes it, in the
// caller's transaction under the order → session locks. The attempt counter moves in the same
// guarded UPDATE that consumes; hashes are compared in constant time. A malformed code is not
// rejected early: it is a wrong code and costs an attempt like one, so probing the format tells
// an attacker nothing and buys nothing. A code of another action is not found (a cancel code
// never confirms a refund).
//
// refusal, when not nil, says the action can no longer act on the session: a code that would be
// tried (or counted as wrong) gets it instead, while a dead challenge still answers as dead and a
// consumed code sent again still replays.
//
// by is who confirms. A staff member who saw this code in the outbox (cancel_challenges.seen_by)
// is refused: the code stands for the customer's consent only when whoever confirms it did not
// read it. Their attempt is not a wrong guess and consumes nothing.
func (s *Service) tryCode(ctx context.Context, tx pgx.Tx, sessionID, challengeID string, action CodeAction, code string, now time.Time,
	refusal *Error, by Actor) (codeAttempt, error) {
	if !validUUID(challengeID) {
		return codeAttempt{}, Invalid("challenge_id", "challenge_id is not a challenge of this payment")
	}
	// The code's hash is bound to the id as issued (lower case): the same id in upper case is the
	// same challenge, and its right code must not count as a wrong guess.
	challengeID = strings.ToLower(challengeID)
	var (
		ch           = codeChallenge{ID: challengeID}
		hash         []byte
		expiresAt    time.Time
		attempts     int
		maxAttempts  int
		consumedAt   *time.Time
		supersededAt *time.Time
		seen         bool
		seenBy       *string // who read the code in the outbox, linked to the confirmer by a password one of them set
		setterSaw    bool    // the confirmer had set the password of one who read it, when they read it
	)
	seer := ""
	if by.Kind == ActorStaff {
		seer = by.ID
	}
	err := tx.QueryRow(ctx, `SELECT code_hash, expires_at, attempts, max_attempts, consumed_at, superseded_at,
			coalesce(amount, 0), coalesce(request_key, ''), $4 = ANY(seen_by),
			(SELECT s FROM unnest(seen_by) s WHERE password_linked(s, $4) LIMIT 1), $4 = ANY(seen_by_setters)
		FROM cancel_challenges WHERE id = $1 AND session_id = $2 AND action = $3 FOR UPDATE`, challengeID, sessionID, string(action), seer).
		Scan(&hash, &expiresAt, &attempts, &maxAttempts, &consumedAt, &supersededAt, &ch.Amount, &ch.RequestKey, &seen, &seenBy, &setterSaw)
	if errors.Is(err, pgx.ErrNoRows) {
		return codeAttempt{}, Errorf(ENOTFOUND, "challenge %s not found for this payment", challengeID)
	}
	if err != nil {
		return codeAttempt{}, fmt.Errorf("one-time code: challenge: %w", err)
	}
	match := s.codeMatches(hash, challengeID, code)
	if consumedAt != nil {
		// A used code only replays what it confirmed. The same code again reports what the
		// first confirmation did, whatever the budget says since: the contract's "the same code
		// again → 200", a client's retry after its answer was lost — answered 429 once a
		// mistyped retry had spent the budget, it told the shop a cancel that went through had
		// failed (an outside review, cancels). Telling the right code of a used challenge
		// apart gives nothing: it is spent, and every other code is its own random one.
		if match {
			return codeAttempt{Challenge: ch, Replayed: true}, nil
		}
		// Wrong guesses at a used code are held to the payment's guess budget (10 wrong codes a
		// day across all its codes: the contract): they were answered one by one without end
		// (an outside review).
		guessesLeft, err := s.codeGuessesLeft(ctx, tx, sessionID, now)
		if err != nil {
			return codeAttempt{}, err
		}
		if err := countWrongGuess(ctx, tx, sessionID, challengeID, now, by); err != nil {
			return codeAttempt{}, err
		}
		wrong := Errorf(EWRONG, "wrong code")
		switch {
		case guessesLeft-1 <= 0:
			wrong = budgetSpentWrong()
		case refusal != nil:
			wrong = refusal
		}
		return codeAttempt{Challenge: ch, Wrong: wrong}, nil
	}
	if supersededAt != nil || !expiresAt.After(now) {
		// A payment whose codes are locked answers its lock (429, Retry-After) to every
		// confirmation, as the contract says: "request a new one" sent the client to a request
		// that is refused (an outside review).
		if _, err := s.codeGuessesLeft(ctx, tx, sessionID, now); err != nil {
			return codeAttempt{}, err
		}
	}
	if supersededAt != nil {
		var unsent string // skipped for want of room, or withdrawn from its text (notify.go's claim): no newer code exists
		var tried bool    // a POST of it went out before the skip: its answer lost, it may have arrived
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(skip_reason), ''), coalesce(bool_or(attempts > 0), false) FROM outbox
			WHERE payment_id = $1 AND challenge_id = $2 AND skip_reason IN ('no_room', 'redacted')`,
			sessionID, challengeID).Scan(&unsent, &tried); err != nil {
			return codeAttempt{}, fmt.Errorf("one-time code: why superseded: %w", err)
		}
		switch {
		case unsent == "no_room" && tried:
			return codeAttempt{}, Errorf(EEXPIRED, "this code no longer works: the refund it confirms no longer fitted what the payment had left (its delivery failed, though it may have reached the customer); request a new code")
		case unsent == "no_room":
			return codeAttempt{}, Errorf(EEXPIRED, "this code was not sent: the refund it confirms no longer fitted what the payment had left; request a new code")
		case unsent == "redacted":
			return codeAttempt{}, Errorf(EEXPIRED, "this code was withdrawn while it could not be used (it may not have reached the customer); request a new code")
		}
		return codeAttempt{}, Errorf(EEXPIRED, "a newer code was sent for this payment; only the latest one works")
	}
	if !expiresAt.After(now) {
		return codeAttempt{}, Errorf(EEXPIRED, "the code has expired; request a new one")
	}
	if refusal != nil {
		return codeAttempt{}, refusal
	}
	if seen {
		return codeAttempt{}, Errorf(EFORBIDDEN, "you saw this code in the outbox: it stands for the customer's consent only when someone who did not read it confirms it with the customer")
	}
	// Whoever set an account's password knows it and could be the one typing (or reading): to
	// this rule the two accounts are one person (migration 00490).
	if seenBy != nil {
		return codeAttempt{}, Errorf(EFORBIDDEN, "%s saw this code in the outbox, and one of you set the other's password, so one person could be "+
			"reading and confirming it: someone else must confirm it with the customer (or get a password set from the command line)", *seenBy)
	}
	// The link as it was when the code was read: a reset of the reader's password since does not
	// make the one who could have been the reader someone else (migration 00630).
	if setterSaw {
		return codeAttempt{}, Errorf(EFORBIDDEN, "when this code was read in the outbox, you had set the reader's password (or the password of someone who did), "+
			"so one person could be reading and confirming it: someone else must confirm it with the customer")
	}
	// The payment's guess budget first: once it is spent, no code (not even the right one) is
	// tried, so guessing on and on never pays.
	guessesLeft, err := s.codeGuessesLeft(ctx, tx, sessionID, now)
	if err != nil {
		return codeAttempt{}, err
	}
	if attempts >= maxAttempts {
		return codeAttempt{}, Errorf(ELOCKED, "too many wrong codes; request a new one")
	}
	// Consume (or count a wrong attempt) in one guarded UPDATE. The FOR UPDATE above already
	// serialises confirmations of this challenge; the guard repeats the rules so the UPDATE
	// alone is correct too.
	var consumed bool
	var left int
	err = tx.QueryRow(ctx, `UPDATE cancel_challenges
		SET attempts = attempts + 1, consumed_at = CASE WHEN $3 THEN $2::timestamptz END
		WHERE id = $1 AND consumed_at IS NULL AND superseded_at IS NULL AND attempts < max_attempts AND expires_at > $2
		RETURNING consumed_at IS NOT NULL, max_attempts - attempts`, challengeID, now, match).Scan(&consumed, &left)
	if err != nil {
		return codeAttempt{}, fmt.Errorf("one-time code: consume: %w", err)
	}
	if consumed {
		return codeAttempt{Challenge: ch}, nil
	}
	if err := countWrongGuess(ctx, tx, sessionID, challengeID, now, by); err != nil {
		return codeAttempt{}, err
	}
	// What is left is the code's attempts or the payment's budget, whichever is smaller.
	budgetSpent := false
	if guessesLeft-1 < left {
		left, budgetSpent = guessesLeft-1, guessesLeft-1 <= 0
	}
	wrong := &Error{Code: EWRONG, Message: fmt.Sprintf("wrong code; %d attempts left", left)}
	if left == 1 {
		wrong.Message = "wrong code; 1 attempt left"
	}
	switch {
	case budgetSpent:
		wrong = budgetSpentWrong()
	case left <= 0:
		wrong.Message = "wrong code; no attempts left, request a new one"
	}
	return codeAttempt{Challenge: ch, Wrong: wrong}, nil
}

// countWrongGuess writes one wrong guess against the payment's daily budget, in the caller's
// transaction under the order → session locks.
func countWrongGuess(ctx context.Context, tx pgx.Tx, sessionID, challengeID string, now time.Time, by Actor) error {
	if _, err := tx.Exec(ctx, `INSERT INTO code_wrong_guesses (session_id, challenge_id, created_at, guessed_by) VALUES ($1, $2, $3, $4)`,
		sessionID, challengeID, now, string(by.Kind)+":"+by.ID); err != nil {
		return fmt.Errorf("one-time code: count wrong guess: %w", err)
	}
	return nil
}

// budgetSpentWrong answers the wrong guess that spent the payment's budget.
func budgetSpentWrong() *Error {
	return &Error{Code: EWRONG, Message: fmt.Sprintf("wrong code; that was the %dth wrong code for this payment today: codes are locked; a finance or admin user can unlock them", CodeGuessesPerDay)}
}

// redactedCode stands for the code in the outbox once the message was delivered.
const redactedCode = "••••••"

// codeRequestAllowed enforces the limits on asking for a new code, in the caller's transaction
// under the order → session locks (so two replicas cannot both take the last request): at most
// CodeRequestsPerHour challenges created within the hour before now, none while the payment's
// guess budget is spent, and, when configured, at most CodeRequestsPerContact codes sent to its
// contact within the hour. ELOCKED carries when asking makes sense again.
func (s *Service) codeRequestAllowed(ctx context.Context, tx pgx.Tx, sessionID, recipient string, now time.Time) error {
	var n int
	var oldest *time.Time
	if err := tx.QueryRow(ctx, `SELECT count(*), min(created_at) FROM cancel_challenges
		WHERE session_id = $1 AND created_at > $2`, sessionID, now.Add(-time.Hour)).Scan(&n, &oldest); err != nil {
		return fmt.Errorf("one-time code: count requests: %w", err)
	}
	var hourly error
	if n >= CodeRequestsPerHour {
		wait := oldest.Add(time.Hour).Sub(now)
		hourly = &Error{Code: ELOCKED, RetryAfter: wait,
			Message: fmt.Sprintf("at most %d codes per payment per hour were sent already; ask again in %s", CodeRequestsPerHour, RoundUpWait(wait))}
	}
	_, budget := s.codeGuessesLeft(ctx, tx, sessionID, now)
	return longestWait(hourly, budget, s.contactCodesAllowed(ctx, tx, recipient, now))
}

// longestWait is the refusal of the limits that lasts longest: the client waits as told, once.
// The first limit found answered, and a payment whose codes were locked for a day answered the
// hour's "ask again in 50m" — asked again then, it was refused for 23 hours more (an outside
// review, cancels). An error that is no limit's refusal is returned first.
func longestWait(errs ...error) error {
	var longest *Error
	for _, err := range errs {
		if err == nil {
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Code != ELOCKED {
			return err
		}
		if longest == nil || e.RetryAfter > longest.RetryAfter {
			longest = e
		}
	}
	if longest == nil {
		return nil
	}
	return longest
}

// contactCodesAllowed: at most Config.CodeRequestsPerContact code messages to one recipient
// within the hour before now, across its payments, the contact read as one recipient
// (pitlane_contact_key: a phone by its digits and +, anything else lower case without white space;
// migrations 00960, 00970). The caller (issueCode) holds the recipient's lock. Off ("") when the
// limit is 0 or the payment's contact names nobody.
func (s *Service) contactCodesAllowed(ctx context.Context, tx pgx.Tx, recipient string, now time.Time) error {
	if recipient == "" {
		return nil
	}
	limit := s.cfg.CodeRequestsPerContact
	var n int
	var oldest *time.Time
	if err := tx.QueryRow(ctx, `SELECT count(*), min(created_at) FROM outbox
		WHERE pitlane_contact_key(to_addr) = $1 AND challenge_id IS NOT NULL AND created_at > $2`,
		recipient, now.Add(-time.Hour)).Scan(&n, &oldest); err != nil {
		return fmt.Errorf("one-time code: count the contact's codes: %w", err)
	}
	if n < limit {
		return nil
	}
	wait := oldest.Add(time.Hour).Sub(now)
	return &Error{Code: ELOCKED, RetryAfter: wait,
		Message: fmt.Sprintf("at most %d codes per hour go to one customer contact, across its payments, and this payment's contact has had them; ask again in %s", limit, RoundUpWait(wait))}
}

// codeGuessesLeft returns how many wrong guesses the payment may still make within the 24 hours
// before now, or ELOCKED (with when the oldest counted guess lapses) when none. The caller holds
// the order → session locks and writes its own wrong guess in the same transaction.
func (s *Service) codeGuessesLeft(ctx context.Context, tx pgx.Tx, sessionID string, now time.Time) (int, error) {
	n, until, err := codeLock(ctx, tx, sessionID, now)
	if err != nil {
		return 0, err
	}
	if until != nil {
		wait := until.Sub(now)
		return 0, &Error{Code: ELOCKED, RetryAfter: wait,
			Message: fmt.Sprintf("%d wrong codes for this payment within a day: codes are locked for %s; a finance or admin user can unlock them on the payment's page meanwhile", CodeGuessesPerDay, RoundUpWait(wait))}
	}
	return CodeGuessesPerDay - n, nil
}

// codeLock counts the payment's wrong guesses that count: within the 24 hours before now and
// not cleared by UnlockCodes. until is when the lock lapses by itself (the oldest counted guess
// is a day old), nil while the payment is not locked.
func codeLock(ctx context.Context, q querier, sessionID string, now time.Time) (n int, until *time.Time, err error) {
	var oldest *time.Time
	if err := q.QueryRow(ctx, `SELECT count(*), min(created_at) FROM code_wrong_guesses
		WHERE session_id = $1 AND created_at > $2 AND cleared_at IS NULL`, sessionID, now.Add(-24*time.Hour)).Scan(&n, &oldest); err != nil {
		return 0, nil, fmt.Errorf("one-time code: count wrong guesses: %w", err)
	}
	if n < CodeGuessesPerDay {
		return n, nil, nil
	}
	t := oldest.Add(24 * time.Hour)
	return n, &t, nil
}

// UnlockCodes lifts a payment's code lock before it lapses by itself: a finance or admin user
// (the route's permission; support, who asks for codes and types them in, cannot clear its own
// guesses) clears the wrong guesses that count, with a reason — how the customer was reached,
// say — in the audit log, in the transaction that clears them. The guesses stay, marked cleared.
// Only a locked payment is unlocked (ECONFLICT otherwise), so the action cannot be used to top
// up a budget that is not spent. It holds the session row, as every code attempt does while it
// counts and adds its guess, so an unlock and a guess never interleave.
func (s *Service) UnlockCodes(ctx context.Context, by Staff, sessionID, reason string) (int, error) {
	if !validUUID(sessionID) {
		return 0, Errorf(ENOTFOUND, "payment %q not found", sessionID)
	}
	sessionID = strings.ToLower(sessionID) // the audit's target, as the payment's page looks it up
	reason, err := requiredText("reason", reason, "say why the codes are unlocked (how the customer was reached, for instance)", MaxResolutionLength)
	if err != nil {
		return 0, err
	}
	now := s.cfg.Clock.Now()
	var cleared int64
	err = s.inTx(ctx, "unlock codes", func(tx pgx.Tx) error {
		// The session's row, and the acting console session looked at again under it, as every
		// change under a payment's locks does (lockOrderAndSessionWith): a finance user disabled
		// or made support while the unlock waited for the row reset the payment's guess budget
		// all the same (an outside review).
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM payment_sessions WHERE id = $1 FOR UPDATE`, sessionID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return Errorf(ENOTFOUND, "payment %s not found", sessionID)
		}
		if err != nil {
			return dbError("unlock codes: lock", err, "")
		}
		if err := staffStands(ctx, tx); err != nil {
			return err
		}
		if _, until, err := codeLock(ctx, tx, sessionID, now); err != nil {
			return err
		} else if until == nil {
			return Errorf(ECONFLICT, "the one-time codes of payment %s are not locked", sessionID)
		}
		// The one who types the codes in does not reset their own budget (an admin may do both;
		// linked by a password one of them set, two accounts are one person here too, the link
		// as it is now or as it was when the code was typed: guesser_setters, migration 00720).
		var own bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM code_wrong_guesses
			WHERE session_id = $1 AND created_at > $2 AND cleared_at IS NULL AND guessed_by LIKE 'staff:%'
			  AND (guessed_by = 'staff:' || $3 OR password_linked(substr(guessed_by, 7), $3) OR $3 = ANY(guesser_setters)))`,
			sessionID, now.Add(-24*time.Hour), by.Email).Scan(&own); err != nil {
			return fmt.Errorf("unlock codes: who guessed: %w", err)
		}
		if own {
			return Errorf(EFORBIDDEN, "you typed some of these wrong codes yourself (or someone whose password one of you set did): "+
				"whoever types the codes in does not unlock them; another finance or admin user can")
		}
		tag, err := tx.Exec(ctx, `UPDATE code_wrong_guesses SET cleared_at = $2, cleared_by = $3
			WHERE session_id = $1 AND created_at > $4 AND cleared_at IS NULL`, sessionID, now, by.Email, now.Add(-24*time.Hour))
		if err != nil {
			return fmt.Errorf("unlock codes: %w", err)
		}
		cleared = tag.RowsAffected()
		return recordAudit(ctx, tx, AuditEntry{Actor: by.Email, Role: by.Role, Action: AuditCodesUnlock,
			Target: sessionID, Detail: fmt.Sprintf("%d wrong codes cleared: %s", cleared, reason)}, now)
	})
	return int(cleared), err
}

// RoundUpWait writes a wait for people (a refusal's "try again in …"), never shorter than it is: whole seconds up to a minute (what
// Retry-After says), whole minutes above.
func RoundUpWait(d time.Duration) string {
	if secs := (max(d, 0) + time.Second - 1).Truncate(time.Second); secs < time.Minute {
		return secs.String() // "15s", as Retry-After says
	}
	return strings.TrimSuffix((d + time.Minute - 1).Truncate(time.Minute).String(), "0s") // "1m", "58m", "23h59m"
}

// codeHash is HMAC-SHA256(secret, challenge id || 0 || code): a keyed hash, so a database dump
// does not reveal codes, and bound to the challenge, so equal codes hash differently.
func (s *Service) codeHash(challengeID, code string) []byte {
	return codeHashUnder(s.cfg.CodeSecret, challengeID, code)
}

func codeHashUnder(secret []byte, challengeID, code string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(challengeID))
	m.Write([]byte{0})
	m.Write([]byte(code))
	return m.Sum(nil)
}

// codeMatches reports whether code is the challenge's, whichever secret stored it: the current
// one or a fallback (a code sent by a replica still on the old SECRET_KEY, or already on the new
// one, while a rotation rolls out). Each comparison is constant-time.
func (s *Service) codeMatches(stored []byte, challengeID, code string) bool {
	match := hmac.Equal(stored, s.codeHash(challengeID, code))
	for _, fb := range s.cfg.CodeSecretFallbacks {
		match = hmac.Equal(stored, codeHashUnder(fb, challengeID, code)) || match
	}
	return match
}

// newCode returns a uniformly random 6-digit code from crypto/rand.
func newCode() (string, error) {
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%06d", n.Int64()), nil
}
