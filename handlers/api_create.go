package handlers

import (
	"context"
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
// Idempotency is payments.Idempotency.Run's (validation runs first, so a bad request never
// touches its key). With an Idempotency-Key a completed key replays the session it created AS IT
// IS NOW, with the first answer's status and Idempotent-Replayed: true. Without one, the
// business intent (order, amount, currency; 5 minutes sliding from the last identical request)
// is the key, so a client that forgot keys still gets one session for a burst of retries, and a
// fresh attempt after a decline an hour later is a new intent. The intent key is completed in
// the claim's transaction, with the session (payments.KeyBinding): identical keyless Creates
// that arrive after that replay the session from the key; those that arrive while the first is
// still inside its claim are answered by the core's per-order claim (BusyRunsEffect). Either
// way: the one session, never a 409.
func (a *API) CreatePayment(c echo.Context) error {
	req, err := parseCreate(c.Request(), PathParam(c, "order_id"))
	if err != nil {
		return err
	}
	ir := payments.IdempotencyRequest{ClientID: ClientFrom(c).ID, Method: http.MethodPost, Path: req.Path}
	if req.Key != "" {
		ir.Kind, ir.Key, ir.Fingerprint = payments.IdempotencyClientKey, req.Key, req.Fingerprint
	} else {
		// The intent is the operation, not the bytes: a retry that differs only in
		// customer_contact is the same intent, so the fingerprint is the intent key itself.
		ir.Kind, ir.BusyRunsEffect = payments.IdempotencyIntentKey, true
		ir.Key = payments.IntentKey(req.Input.OrderID, req.Input.Amount, req.Input.Currency)
		req.Input.RefusedStands = a.idem.Config().IntentWindow // a refused registration is the intent's answer
		ir.Fingerprint = payments.Fingerprint(http.MethodPost, req.Path, []byte(ir.Key))
	}
	var sess payments.Session
	out, err := a.idem.Run(c.Request().Context(), ir, func(ctx context.Context, slot payments.Slot) (string, int, error) {
		in := req.Input
		in.FirstAttempt = slot.Fresh
		in.Bind = slot.Binding
		res, err := a.svc.Create(ctx, actor(c), in)
		sess = res.Session
		return res.Session.ID, createdStatus(res), err
	})
	if err != nil {
		return err
	}
	if out.Replayed {
		return a.replay(c, ir, out, req.Input)
	}
	return a.writeCreated(c, out.Status, sess, false)
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

func (a *API) writeCreated(c echo.Context, status int, s payments.Session, replayed bool) error {
	p, err := a.paymentJSON(c.Request().Context(), s)
	if err != nil {
		return err
	}
	return writeResource(c, status, paymentLocation(s.ID), p, replayed)
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
//
// An intent whose session is over (declined, expired, canceled, or the order paid) has nothing
// active to answer with, and the contract's 200 is "an active session ... exists": the keyless
// Create runs through the core again, which answers by the order's state now — 409 when the
// order is paid or has an active session with other parameters, 200 with an active session of
// the same amount and currency that another request started, or a new attempt (201/202). So a
// shop that retries a declined payment without a key gets a new attempt, not the dead session
// for as long as its retries keep the window open. Such a session ends on the gateway's word
// about the customer (a decline or approval, a reverse), and identical retries that arrive
// together meet in the core's per-order claim: one new session, the rest 200 with it. The key
// stays bound to the ended session; the next retry comes here again and finds the new one
// active.
//
// Except a session the gateway refused to register (Failed with no gateway payment: an amount
// over its limit, a risk rule): that ends inside the first request, so every retry of a burst
// arrived after it, and each made a new session and a new registration that the gateway refused
// again. The core answers it (200) for IntentWindow after the refusal, whichever client asks
// (CreateInput.RefusedStands), as a refused refund is the intent's answer; an Idempotency-Key
// tries again at once.
func (a *API) replay(c echo.Context, ir payments.IdempotencyRequest, out payments.Outcome, in payments.CreateInput) error {
	ctx := c.Request().Context()
	sess, err := a.svc.Get(ctx, out.ResourceID)
	if err != nil {
		return err
	}
	if ir.Kind == payments.IdempotencyIntentKey && !sess.Status.Active() {
		res, err := a.svc.Create(ctx, actor(c), in)
		if err != nil {
			return err
		}
		return a.writeCreated(c, createdStatus(res), res.Session, false)
	}
	status := out.Status
	switch {
	case ir.Kind == payments.IdempotencyIntentKey:
		status = http.StatusOK
	case status == 0:
		// The key's request created the session (the claim recorded it with the key) and its
		// answer was never recorded (its replica died, or the database failed it): the answer
		// it would have given, as the session is now. 200 said "already existed" (an outside
		// review, dbfail).
		status = createdStatus(payments.CreateResult{Session: sess, Created: true})
	case status < 200 || status > 299:
		status = http.StatusOK
	}
	return a.writeCreated(c, status, sess, true)
}
