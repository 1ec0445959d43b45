package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The customer's checkout page (handlers/checkout*.go) creates payments through intent keys
// (design.md, "Idempotency": one Pay click = one key, reused by every retry of that click). The
// page embeds a fresh key in the form it renders; CheckoutPay binds the key to the session its
// click created, so a double click, a resubmitted form or a retry after a lost response reaches
// that same session and never a second one, even when the first session has since failed.
//
// Protocol (the API's idempotency keys, cut down to what a form needs):
//  1. Acquire in a short transaction. The key's row read FOR UPDATE: bound to a session → that
//     session (replay); held by a running click and not stale → EBUSY (the page says "preparing
//     your payment" and looks again); stale → take over. No row: a new click, which spends one of
//     the order's CheckoutStartsPerHour (under the order's lock), then INSERT … ON CONFLICT DO
//     NOTHING (a conflict: the same click's other request inserted it meanwhile; read it as
//     above). Every acquire (the insert or a take-over) writes a fresh lock_token: the holder's.
//  2. Create (claim + register) with no lock held.
//  3. Bind the key to the session, or let go of it after a failure so the same click may retry;
//     both only while the key carries this request's token and no session (migration 00570). A
//     request slower than the stale time may have lost its key to a retry of the click meanwhile,
//     which then holds it, or bound it to the session it created: the slow request's late bind
//     or release must change neither.

// CheckoutStartsPerHour is how many new Pay clicks (new intent keys) one order may start from the
// checkout within an hour. Every new click runs a Create, and when the gateway refuses
// registrations outright (an amount over its limit, a risk rule) each one is a new session,
// failed at once, and a new Register call, and the page offers "Try again" again: without a
// budget anyone holding the order's link could loop and spend the merchant's rate limit at the
// gateway. Ten is far more than a customer retrying after declines needs in an hour (each try is
// a trip to the bank's page), and bounds a loop to ten registrations an hour per order. The
// budget is counted in PostgreSQL (the order's intents of the last hour) under the order's lock,
// so every replica spends the same one. A repeat of a click (the same key: a double click, a
// resubmit, a take-over of a stale click) is that click and spends nothing. Over the budget:
// ELOCKED (429) with when the oldest counted click is an hour old.
const CheckoutStartsPerHour = 10

// CheckoutIntent is one Pay click.
type CheckoutIntent struct {
	Key         string
	OrderID     string
	Amount      int64
	Currency    string
	SessionID   string // "" while its Create runs, or after it failed
	LockedUntil *time.Time
	CreatedAt   time.Time
}

// InFlight reports whether the click's Create is still running at now.
func (i CheckoutIntent) InFlight(now time.Time) bool {
	return i.SessionID == "" && i.LockedUntil != nil && i.LockedUntil.After(now)
}

// CheckoutPayResult is the outcome of CheckoutPay. Replayed: the key had already created the
// session; nothing new happened.
type CheckoutPayResult struct {
	Session  Session
	Replayed bool
}

// CheckoutPay runs one Pay click: the key's session, creating it (svc.Create as the customer)
// the first time. staleAfter bounds how long a click may hold its key before another request
// with it may take over (payments.StaleAfterFor(GATEWAY_TIMEOUT)); 0 means the default. A new
// key spends one of the order's CheckoutStartsPerHour (ELOCKED once they are spent).
//
// The browser abandons the first request of a double click; the Create it started must finish
// and be bound all the same, so the work runs on a context that does not end with the request.
// It ends with the click's hold on its key (staleAfter), past which another request of the
// click may take the key over: a database that answers nothing (a host gone quiet, a pool whose
// connections are all taken) held the click, its goroutine and what it had acquired for as long
// as it stayed silent. The records of a Create whose gateway has spoken, and the key's bind or
// release after it, get RecordGrace beyond that (as an API call's do past its bound); a click cut
// at the gateway is the patrol's to resolve, as any call cut there.
func (s *Service) CheckoutPay(ctx context.Context, key string, in CreateInput, staleAfter time.Duration) (CheckoutPayResult, error) {
	if !validUUID(key) {
		return CheckoutPayResult{}, Invalid("intent", "the payment form is damaged; reload the page")
	}
	if err := in.Validate(); err != nil {
		return CheckoutPayResult{}, err
	}
	if staleAfter <= 0 {
		staleAfter = StaleAfterFor(0)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), staleAfter)
	defer cancel()
	res, err := s.checkoutPay(ctx, key, in, staleAfter)
	if err != nil && ctx.Err() != nil && ErrorCode(err) == EINTERNAL {
		// The hold ran out in a wait on the database: the click may be sent again (503).
		err = &Error{Code: EUNAVAIL, Message: unavailableMessage, Err: err}
	}
	return res, err
}

// bindIntentSQL binds a click's intent to the payment its request started, by the request's token.
const bindIntentSQL = `UPDATE checkout_intents SET session_id = $3, locked_until = NULL, lock_token = NULL
	WHERE key = $1 AND lock_token = $2 AND session_id IS NULL`

func (s *Service) checkoutPay(ctx context.Context, key string, in CreateInput, staleAfter time.Duration) (CheckoutPayResult, error) {
	now := s.cfg.Clock.Now()
	token := uuid.NewString() // this request's hold on the key, if it gets one
	var bound string
	keyless := false // a new click on an order that starts nothing: no row (startsNothing)
	took := false    // the key taken under token
	mayHaveCommitted, err := s.inTxCommit(ctx, "checkout: acquire intent", func(tx pgx.Tx) error {
		it, found, err := lockIntent(ctx, tx, key)
		if err != nil {
			return err
		}
		if !found {
			// A new click. Its budget first, then its row, under the order's lock (a claim's
			// lock, held here for two statements: nothing slow happens under it).
			if keyless, err = s.checkoutStartAllowed(ctx, tx, key, in, now); err != nil || keyless {
				return err
			}
			var inserted bool
			err := tx.QueryRow(ctx, `INSERT INTO checkout_intents (key, order_id, amount, currency, locked_until, created_at, lock_token)
				VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (key) DO NOTHING RETURNING true`,
				key, in.OrderID, in.Amount, in.Currency, now.Add(staleAfter), now, token).Scan(&inserted)
			if err == nil {
				took = true
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return dbError("checkout: insert intent", err, "")
			}
			// The click's other request (a double click) inserted the key while this one waited
			// for the order's lock: this is a repeat of that click, handled as one below.
			if it, found, err = lockIntent(ctx, tx, key); err != nil {
				return err
			} else if !found {
				return Errorf(EINTERNAL, "checkout: intent %s conflicts but is not there", key)
			}
		}
		switch {
		case it.OrderID != in.OrderID || it.Amount != in.Amount || it.Currency != in.Currency:
			return Invalid("intent", "this payment form was for another order or amount; reload the page")
		case it.SessionID != "":
			bound = it.SessionID
			return nil
		case it.InFlight(now):
			return Errorf(EBUSY, "your payment is being prepared")
		}
		// A stale hold (its request died, or is slower than staleAfter): taken over, under a new
		// token, so the old request's late bind or release finds the key is no longer its own.
		_, err = tx.Exec(ctx, `UPDATE checkout_intents SET locked_until = $2, lock_token = $3 WHERE key = $1`, key, now.Add(staleAfter), token)
		took = err == nil
		return err
	})
	if err != nil {
		if took && mayHaveCommitted {
			// Its COMMIT may have taken the key with the answer lost (a failover): the same click
			// sent again waited "being prepared" until the hold ran out, though nothing ran (an
			// outside review, lost commits). Let go of by its token, as an API key is.
			s.writeLater("checkout intent", staleAfter, "checkout: let go of intent", `UPDATE checkout_intents SET locked_until = NULL, lock_token = NULL
				WHERE key = $1 AND lock_token = $2 AND session_id IS NULL`, key, token)
		}
		return CheckoutPayResult{}, err
	}
	if bound != "" {
		sess, err := s.Get(ctx, bound)
		return CheckoutPayResult{Session: sess, Replayed: true}, err
	}
	in.checkoutPrice = true // the order's checkout price, if the shop set one, is what a Pay click pays
	if h := s.cfg.Hooks.AfterIntentAcquire; h != nil {
		h(ctx, key)
	}
	if keyless {
		return s.checkoutPayKeyless(ctx, key, in)
	}
	actor := checkoutActor(key)
	res, err := s.Create(ctx, actor, in)
	ctx, cancelRecord := Outlive(ctx, RecordGrace) // the key's bind or release, once Create is done
	defer cancelRecord()
	if err != nil {
		// The click's Create failed: refused, or its outcome is unknown. Its claim may have
		// committed a session all the same (the connection of the transaction writing the
		// gateway's answer died, say): the key is bound to that session (its first event names
		// this click), so the same click sent again answers it — a second session once the first
		// had failed was a second payment for one click (an outside review). With no session,
		// the key is let go so the same click may try again; Create's per-order claim makes a
		// repeat safe. Only while the key is still this request's: a retry that took it over
		// holds it now.
		if _, uerr := s.execBounded(ctx, "checkout: release intent", `UPDATE checkout_intents SET locked_until = NULL, lock_token = NULL,
			session_id = (SELECT e.session_id FROM payment_sessions ps JOIN session_events e ON e.session_id = ps.id
				WHERE ps.order_id = $3 AND e.from_status IS NULL AND e.actor_kind = $4 AND e.actor_id = $5 LIMIT 1)
			WHERE key = $1 AND lock_token = $2 AND session_id IS NULL`, key, token, in.OrderID, string(actor.Kind), actor.ID); uerr != nil {
			s.log.Error("checkout: release intent", "err", uerr)
		}
		return CheckoutPayResult{}, err
	}
	// Bounded: the session's foreign key waits for its row (execBounded).
	tag, err := s.execBounded(ctx, "checkout: bind intent", bindIntentSQL, key, token, res.Session.ID)
	if err != nil {
		// The bind may have committed with its answer lost, or not: the click's payment exists
		// either way, and the customer goes to it (answered 503, they were told to try again
		// while the bank's page waited: an outside review, lost commits). The bind is written in
		// the background, by its token (nothing when it committed).
		s.log.Warn("checkout: bind intent failed; binding in the background", "key", key, "session", res.Session.ID, "err", err)
		s.writeLater("checkout intent", staleAfter, "checkout: bind intent", bindIntentSQL, key, token, res.Session.ID)
		return CheckoutPayResult{Session: res.Session}, nil
	}
	if tag.RowsAffected() == 0 {
		return s.lostIntent(ctx, key, res.Session)
	}
	return CheckoutPayResult{Session: res.Session}, nil
}

// checkoutPayKeyless runs a new click on an order that starts nothing (paid, or a payment
// active: checkoutStartAllowed) without writing its key: Create answers the order's state (its
// active session, or why not), and a repeat of the click gets the same answer. A row for such a
// click counted against the order's CheckoutStartsPerHour although it started nothing, and
// anyone holding the link could post made-up keys while a payment ran: rows without end, and the
// customer's first "Try again" after a decline refused for an hour (an outside review, resource
// exhaustion). Should the order's payment end between the check and Create's claim, this click
// does start one: its key is written in the claim, bound to the session and counted like any
// start (CreateInput.checkoutStart).
func (s *Service) checkoutPayKeyless(ctx context.Context, key string, in CreateInput) (CheckoutPayResult, error) {
	in.checkoutStart = key // the claim holds a start to the order's budget, and writes it
	res, err := s.Create(ctx, checkoutActor(key), in)
	if err != nil {
		return CheckoutPayResult{}, err
	}
	return CheckoutPayResult{Session: res.Session}, nil
}

// checkoutActor is the customer whose Pay click (key) creates a payment.
func checkoutActor(key string) Actor { return Actor{Kind: ActorCustomer, ID: "checkout:" + key} }

// lostIntent answers a click whose request got its session (own, created or found by its
// Create) but lost the key before it could bind it: a retry of the click took the key over while
// this request was slower than the stale time. The click's outcome is the key's: the session the
// retry bound (a replay); while the retry still runs, or after it let go of the key, own (the
// page follows the key from there).
func (s *Service) lostIntent(ctx context.Context, key string, own Session) (CheckoutPayResult, error) {
	it, err := s.GetCheckoutIntent(ctx, key)
	if err != nil {
		return CheckoutPayResult{}, err
	}
	if it.SessionID == "" || it.SessionID == own.ID {
		return CheckoutPayResult{Session: own}, nil
	}
	sess, err := s.Get(ctx, it.SessionID)
	return CheckoutPayResult{Session: sess, Replayed: true}, err
}

// lockIntent reads the key's intent FOR UPDATE in the acquire's transaction (found false: no
// such key).
func lockIntent(ctx context.Context, tx pgx.Tx, key string) (CheckoutIntent, bool, error) {
	it, err := scanIntent(tx.QueryRow(ctx, `SELECT `+intentColumns+` FROM checkout_intents WHERE key = $1 FOR UPDATE`, key))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return CheckoutIntent{}, false, nil
	case err != nil:
		return CheckoutIntent{}, false, dbError("checkout: read intent", err, "")
	}
	return it, true, nil
}

// checkoutStartAllowed spends one of the order's CheckoutStartsPerHour for a new click (key), in
// the acquire's transaction, which it makes hold the order's lock (LockCreateOrder, the claim's:
// a new click waits at most for a claim of the order, itself a short transaction) so two
// replicas cannot both take the last one: at most CheckoutStartsPerHour intents of the order
// created within the hour before now, not counting key itself (the same click's other request
// may have inserted it while this one waited for the lock; it is then a repeat, not a start).
// ELOCKED carries when the oldest counted click is an hour old. startsNothing: the click starts
// nothing and spends nothing (no row is written for it: checkoutPayKeyless) — the order is paid,
// has an active payment, has a late payment in review (ErrPaymentInReview), or its price is
// no longer the click's (ErrLinkReplaced: a replaced link's form, another amount or currency or
// a newer generation of the same). Clicks the claim refuses
// spent the customer's budget: anyone holding a replaced link could post its form ten times an
// hour and the customer's click on the current link was a 429 (TestCheckoutClicksThatAreRefusedSpendNothing).
func (s *Service) checkoutStartAllowed(ctx context.Context, tx pgx.Tx, key string, in CreateInput, now time.Time) (startsNothing bool, err error) {
	orderID := in.OrderID
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(LockCreateOrder), orderID); err != nil {
		return false, dbError("checkout: lock order", err, "")
	}
	var starts checkoutStarts
	// A paid order, or one with an active payment, starts nothing new whatever the click
	// (Create answers "already paid", the active payment, or "another payment is active"): such
	// clicks — stale tabs, the back button — get that answer, not "too many attempts".
	if err := tx.QueryRow(ctx, `SELECT starts.*,
			coalesce((SELECT status = 'Paid' OR active_session_id IS NOT NULL FROM orders WHERE order_id = $1), false)
			OR coalesce((SELECT amount <> $4 OR currency <> $5 OR generation <> coalesce($6, generation) FROM checkout_prices WHERE order_id = $1), false)
			OR (`+paymentInReviewSQL+`)
		FROM (`+checkoutStartsSQL+`) starts`,
		orderID, now.Add(-time.Hour), key, in.Amount, in.Currency, in.CheckoutLinkGen).Scan(&starts.n, &starts.oldest, &startsNothing); err != nil {
		return false, dbError("checkout: count starts", err, "")
	}
	if startsNothing {
		return true, nil
	}
	return false, starts.spent(now)
}

// checkoutStartsSQL counts an order's Pay clicks ($1) that started a payment since $2, but for
// the click $3 itself, and gives the oldest one's time. Read under the order's lock.
const checkoutStartsSQL = `SELECT count(*)::int, min(created_at) FROM checkout_intents WHERE order_id = $1 AND created_at > $2 AND key <> $3`

// checkoutStarts is checkoutStartsSQL's answer.
type checkoutStarts struct {
	n      int
	oldest *time.Time
}

// spent is ELOCKED, with when the oldest counted start is an hour old, once the order's
// CheckoutStartsPerHour are spent.
func (c checkoutStarts) spent(now time.Time) error {
	if c.n < CheckoutStartsPerHour || c.oldest == nil {
		return nil
	}
	wait := c.oldest.Add(time.Hour).Sub(now)
	return &Error{Code: ELOCKED, RetryAfter: wait, Message: fmt.Sprintf(
		"this order's payment was started %d times within the last hour, the most we allow: please try again in %s. Nothing was charged by this click.",
		CheckoutStartsPerHour, RoundUpWait(wait))}
}

// CheckoutReplay is a repeat of a Pay click whose form may no longer start a payment (its link
// has expired since, or the order's page may no longer retry: CheckoutRetry): a double click
// or a resubmit arriving just after the expiry while the first request of the click registers
// the payment. It answers what CheckoutPay would answer the repeat, and never starts anything:
// the session the key created (Replayed), or EBUSY while the click's first request still runs
// (the page follows it). ENOTFOUND when the key has nothing to replay: never used, used for
// another order, amount or currency, or its request ended without a session (refused, or
// abandoned past its hold) — the caller refuses the click then. Unlike CheckoutPay it takes over
// no key: a take-over would create the payment the expiry forbids.
func (s *Service) CheckoutReplay(ctx context.Context, key string, in CreateInput) (CheckoutPayResult, error) {
	none := Errorf(ENOTFOUND, "no payment of this click to show")
	it, err := s.GetCheckoutIntent(ctx, key)
	switch {
	case ErrorCode(err) == ENOTFOUND:
		return CheckoutPayResult{}, none
	case err != nil:
		return CheckoutPayResult{}, err
	case it.OrderID != in.OrderID || it.Amount != in.Amount || it.Currency != in.Currency:
		return CheckoutPayResult{}, none
	case it.SessionID != "":
		sess, err := s.Get(ctx, it.SessionID)
		return CheckoutPayResult{Session: sess, Replayed: true}, err
	case it.InFlight(s.cfg.Clock.Now()):
		return CheckoutPayResult{}, Errorf(EBUSY, "your payment is being prepared")
	}
	return CheckoutPayResult{}, none
}

const intentColumns = `key::text, order_id, amount, currency, coalesce(session_id::text, ''), locked_until, created_at`

func scanIntent(row pgx.Row) (CheckoutIntent, error) {
	var i CheckoutIntent
	err := row.Scan(&i.Key, &i.OrderID, &i.Amount, &i.Currency, &i.SessionID, &i.LockedUntil, &i.CreatedAt)
	return i, err
}

// GetCheckoutIntent reads one Pay click (ENOTFOUND when the key was never used).
func (s *Service) GetCheckoutIntent(ctx context.Context, key string) (CheckoutIntent, error) {
	if !validUUID(key) {
		return CheckoutIntent{}, Errorf(ENOTFOUND, "no such payment attempt")
	}
	it, err := scanIntent(s.db.QueryRow(ctx, `SELECT `+intentColumns+` FROM checkout_intents WHERE key = $1`, key))
	if err != nil {
		return CheckoutIntent{}, dbError("checkout: get intent", err, "no such payment attempt")
	}
	return it, nil
}
