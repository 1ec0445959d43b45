package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The customer's checkout page (handlers/checkout*.go) creates payments through intent keys
// (design.md, "Idempotency": one Pay click = one key, reused by every retry of that click). The
// page embeds a fresh key in the form it renders; CheckoutPay binds the key to the session its
// click created, so a double click, a resubmitted form or a retry after a lost response reaches
// that same session and never a second one, even when the first session has since failed.
//
// Protocol (the API's idempotency keys, cut down to what a form needs):
//  1. Acquire in a short transaction: INSERT … ON CONFLICT DO NOTHING; on conflict read the row
//     FOR UPDATE: bound to a session → that session (replay); held by a running click and not
//     stale → EBUSY (the page says "preparing your payment" and looks again); stale → take over.
//  2. Create (claim + register) with no lock held.
//  3. Bind the key to the session, or let go of it after a failure so the same click may retry.

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
// with it may take over (payments.StaleAfterFor(GATEWAY_TIMEOUT)); 0 means the default.
//
// The browser abandons the first request of a double click; the Create it started must finish
// and be bound all the same, so the work runs on a context that does not end with the request.
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
	ctx = context.WithoutCancel(ctx)
	now := s.cfg.Clock.Now()
	var bound string
	err := s.inTx(ctx, "checkout: acquire intent", func(tx pgx.Tx) error {
		var acquired bool
		err := tx.QueryRow(ctx, `INSERT INTO checkout_intents (key, order_id, amount, currency, locked_until, created_at)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO NOTHING RETURNING true`,
			key, in.OrderID, in.Amount, in.Currency, now.Add(staleAfter), now).Scan(&acquired)
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return dbError("checkout: insert intent", err, "")
		}
		it, err := scanIntent(tx.QueryRow(ctx, `SELECT `+intentColumns+` FROM checkout_intents WHERE key = $1 FOR UPDATE`, key))
		if err != nil {
			return dbError("checkout: read intent", err, "")
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
		_, err = tx.Exec(ctx, `UPDATE checkout_intents SET locked_until = $2 WHERE key = $1`, key, now.Add(staleAfter))
		return err
	})
	if err != nil {
		return CheckoutPayResult{}, err
	}
	if bound != "" {
		sess, err := s.Get(ctx, bound)
		return CheckoutPayResult{Session: sess, Replayed: true}, err
	}
	in.checkoutPrice = true // the order's checkout price, if the shop set one, is what a Pay click pays
	res, err := s.Create(ctx, Actor{Kind: ActorCustomer, ID: "checkout:" + key}, in)
	if err != nil {
		// No session for this click (refused, or the outcome is unknown): let the key go so the
		// same click may try again; Create's per-order claim makes a repeat safe.
		if _, uerr := s.db.Exec(ctx, `UPDATE checkout_intents SET locked_until = NULL WHERE key = $1 AND session_id IS NULL`, key); uerr != nil {
			s.log.Error("checkout: release intent", "err", uerr)
		}
		return CheckoutPayResult{}, err
	}
	if _, err := s.db.Exec(ctx, `UPDATE checkout_intents SET session_id = $2, locked_until = NULL WHERE key = $1`, key, res.Session.ID); err != nil {
		return CheckoutPayResult{}, fmt.Errorf("checkout: bind intent: %w", err)
	}
	return CheckoutPayResult{Session: res.Session}, nil
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
