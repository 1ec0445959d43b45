package handlers

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// CreatePayment: POST /api/v1/orders/{order_id}/payments.
//
//	201 a new session the gateway registered; 202 a new session whose registration is not yet
//	confirmed; 200 an active session with the same amount and currency already existed (as it is
//	now); 409 other parameters are active or the order is paid. Location on every success.
//
// Idempotency (payments/idempotency.go has the protocol): validation runs first, so a bad
// request never touches its key. With an Idempotency-Key the key is acquired for this client;
// a completed key replays the session it created AS IT IS NOW, with the first answer's status
// and Idempotent-Replayed: true. Without one, a business-intent key (order, amount, currency,
// 5-minute window of the service clock) is acquired the same way, so a client that forgot keys
// still gets one session for a burst of retries, and a fresh attempt after a decline an hour
// later is a new intent.
func (a *API) CreatePayment(c echo.Context) error {
	req, err := parseCreate(c.Request(), pathParam(c, "order_id"))
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	client := ClientFrom(c)
	ir := payments.IdempotencyRequest{ClientID: client.ID, Method: http.MethodPost, Path: req.Path}
	if req.Key != "" {
		ir.Kind, ir.Key, ir.Fingerprint = payments.IdempotencyClientKey, req.Key, req.Fingerprint
	} else {
		// The intent is the operation, not the bytes: a retry that differs only in
		// customer_contact is the same intent, so the fingerprint is the intent key itself.
		ir.Kind = payments.IdempotencyIntentKey
		ir.Key = a.idem.IntentKey(req.Input.OrderID, req.Input.Amount, req.Input.Currency)
		ir.Fingerprint = payments.Fingerprint(http.MethodPost, req.Path, []byte(ir.Key))
	}

	slot, err := a.idem.Acquire(ctx, ir)
	if err != nil {
		if ir.Kind == payments.IdempotencyIntentKey && payments.ErrorCode(err) == payments.EBUSY {
			return a.intentInFlight(c, req.Input, err)
		}
		return err
	}
	if slot.Done {
		return a.replay(c, ir, slot)
	}

	res, err := a.svc.Create(ctx, actor(c), req.Input)
	if err != nil {
		a.giveUpKey(c, ir, slot.Token, err)
		return err
	}
	status := createdStatus(res)
	if err := a.idem.Complete(detached(c), ir, slot.Token, res.Session.ID, status); err != nil {
		// The effect happened and the client gets its answer; the key stays held until it goes
		// stale, and a retry after that finds this session through the core's per-order claim.
		a.log.Warn("idempotency: completing key failed", slog.String("client", client.ID),
			slog.String("kind", string(ir.Kind)), slog.String("session", res.Session.ID), slog.String("error", err.Error()))
	}
	return writeCreated(c, status, res.Session, false)
}

// createdStatus is the contract's status for a Create: a new session the gateway has (or has
// refused) → 201; new but its registration is unconfirmed (Registering, Unknown) → 202; an
// existing active session with the same parameters → 200.
func createdStatus(res payments.CreateResult) int {
	switch {
	case !res.Created:
		return http.StatusOK
	case res.Session.Status == payments.StatusRegistering || res.Session.Status == payments.StatusUnknown:
		return http.StatusAccepted
	default:
		return http.StatusCreated
	}
}

func writeCreated(c echo.Context, status int, s payments.Session, replayed bool) error {
	return writeResource(c, status, paymentLocation(s.ID), toPaymentJSON(s), replayed)
}

// writeResource answers with a resource the request created (or replays): its Location, and
// Idempotent-Replayed when an idempotency key's earlier request created it.
func writeResource(c echo.Context, status int, location string, body any, replayed bool) error {
	c.Response().Header().Set(echo.HeaderLocation, location)
	if replayed {
		c.Response().Header().Set(HeaderIdempotentReplayed, "true")
	}
	return writeJSON(c, status, body)
}

// replay answers a completed key with the current state of the session it created (never a
// stored response: if the payment was canceled since, the replay says Canceled). A client key
// keeps its first status code; an intent replay says 200, the contract's "this active session
// already exists" answer, because the client did not ask for key semantics.
func (a *API) replay(c echo.Context, ir payments.IdempotencyRequest, slot payments.Slot) error {
	sess, err := a.svc.Get(c.Request().Context(), slot.ResourceID)
	if err != nil {
		return err
	}
	status := slot.ResponseCode
	if ir.Kind == payments.IdempotencyIntentKey || status < 200 || status > 299 {
		status = http.StatusOK
	}
	return writeCreated(c, status, sess, true)
}

// intentInFlight answers a keyless request whose intent is still being carried out by another
// request. When that request has already claimed its session, the answer is the contract's 200
// with that session as it is now (what the core would answer too); before the claim, 409 with
// Retry-After, so the burst never yields a second session.
func (a *API) intentInFlight(c echo.Context, in payments.CreateInput, busy error) error {
	_, sessions, err := a.svc.GetOrder(c.Request().Context(), in.OrderID)
	if payments.ErrorCode(err) == payments.ENOTFOUND {
		return busy
	}
	if err != nil {
		return err
	}
	for _, s := range sessions {
		if s.Status.Active() {
			if s.Amount == in.Amount && s.Currency == in.Currency {
				return writeCreated(c, http.StatusOK, s, false)
			}
			return payments.Errorf(payments.ECONFLICT, "order %s already has an active payment %s for %d %s", in.OrderID, s.ID, s.Amount, s.Currency)
		}
	}
	return busy
}

// giveUpKey lets go of a key after Create failed. Failures that by their code had no effect
// (invalid input, not found, a conflict with another session, busy) release the key so the
// client can use it again; anything else (a database or lock timeout mid-way, an internal
// error) may have claimed a session, so the key stays bound to this request and is abandoned
// for the same request to take over (Create again is safe: the core's per-order claim finds the
// session if there is one).
func (a *API) giveUpKey(c echo.Context, ir payments.IdempotencyRequest, token string, cause error) {
	var err error
	switch payments.ErrorCode(cause) {
	case payments.EINVALID, payments.ENOTFOUND, payments.ECONFLICT, payments.EBUSY:
		err = a.idem.Release(detached(c), ir, token)
	default:
		err = a.idem.Abandon(detached(c), ir, token)
	}
	if err != nil && !errors.Is(err, payments.ErrIdempotencyLockLost) {
		a.log.Warn("idempotency: giving up key failed", slog.String("client", ir.ClientID),
			slog.String("kind", string(ir.Kind)), slog.String("error", err.Error()))
	}
}
