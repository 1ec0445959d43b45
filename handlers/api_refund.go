package handlers

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

const refundsPath = "/api/v1/refunds/"

// refundJSON is the contract's refund object.
type refundJSON struct {
	ID        string    `json:"id"`
	PaymentID string    `json:"payment_id"`
	Amount    int64     `json:"amount"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

func toRefundJSON(r payments.Refund) refundJSON {
	return refundJSON{ID: r.ID, PaymentID: r.PaymentID, Amount: r.Amount, Status: r.Status, CreatedAt: r.CreatedAt.UTC()}
}

func refundLocation(id string) string { return refundsPath + id }

// CreateRefund: POST /api/v1/payments/{id}/refunds {"amount"}.
//
//	201 the gateway answered (Succeeded or Failed); 202 not yet (Pending: the patrol asks again,
//	poll Location); 409 the payment is not Completed or the refunds would exceed the amount
//	received; 422 amount invalid; 404 no such payment. Location: /api/v1/refunds/{id}.
//
// Idempotency is create's protocol (api_create.go): validation first; with an Idempotency-Key
// the key is acquired for this client and a completed key replays the refund it created AS IT
// IS NOW with the first answer's status and Idempotent-Replayed: true; without one, an intent
// key (payment, amount, 5-minute window) is acquired the same way. Failures without effect
// (404, 409, 422) release the key; an uncertain one abandons it to the same request.
//
// The core binds the refund to RequestKey, derived from the key slot (client, kind, key): a
// request that takes the slot over after its first holder died or gave up finds the refund the
// first one claimed instead of making a second.
func (a *API) CreateRefund(c echo.Context) error {
	req, err := parseRefund(c.Request(), pathParam(c, "id"))
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	client := ClientFrom(c)
	ir := payments.IdempotencyRequest{ClientID: client.ID, Method: http.MethodPost, Path: req.Path}
	if req.Key != "" {
		ir.Kind, ir.Key, ir.Fingerprint = payments.IdempotencyClientKey, req.Key, req.Fingerprint
	} else {
		// As for create: the intent is the operation, so its fingerprint is the intent key.
		ir.Kind = payments.IdempotencyIntentKey
		ir.Key = refundIntentKey(req.PaymentID, req.Amount, a.svc.Now(), a.idem.Config().IntentWindow)
		ir.Fingerprint = payments.Fingerprint(http.MethodPost, req.Path, []byte(ir.Key))
	}

	slot, err := a.idem.Acquire(ctx, ir)
	if err != nil {
		// EBUSY (the same key's request still runs, intent or not): 409 + Retry-After.
		return err
	}
	if slot.Done {
		return a.replayRefund(c, ir, slot)
	}

	res, err := a.svc.CreateRefund(ctx, actor(c), payments.RefundInput{
		PaymentID: req.PaymentID, Amount: req.Amount, RequestKey: refundRequestKey(ir, slot),
	})
	if err != nil {
		a.giveUpKey(c, ir, slot.Token, err)
		return err
	}
	status := refundStatus(res.Refund)
	if err := a.idem.Complete(detached(c), ir, slot.Token, res.Refund.ID, status); err != nil {
		// The refund exists and the client gets its answer; a retry after the key goes stale
		// takes it over and finds this refund through its RequestKey.
		a.log.Warn("idempotency: completing key failed", slog.String("client", client.ID),
			slog.String("kind", string(ir.Kind)), slog.String("refund", res.Refund.ID), slog.String("error", err.Error()))
	}
	return writeRefund(c, status, res.Refund, false)
}

// GetRefund: GET /api/v1/refunds/{id} → 200 the refund as it is now; 404.
func (a *API) GetRefund(c echo.Context) error {
	r, err := a.svc.GetRefund(c.Request().Context(), pathParam(c, "id"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toRefundJSON(r))
}

// refundStatus is the contract's status for a refund: the gateway answered (Succeeded, Failed)
// → 201; not yet (Pending) → 202.
func refundStatus(r payments.Refund) int {
	if r.Status == payments.RefundPending {
		return http.StatusAccepted
	}
	return http.StatusCreated
}

func writeRefund(c echo.Context, status int, r payments.Refund, replayed bool) error {
	return writeResource(c, status, refundLocation(r.ID), toRefundJSON(r), replayed)
}

// replayRefund answers a completed key with the current state of the refund it created. A client
// key keeps its first status code (a 202 stays 202 even after the patrol settled the refund:
// the body says Succeeded). An intent replay — the client asked for no key semantics — gets the
// status the refund's current state calls for: 201 once the gateway answered, 202 while Pending.
func (a *API) replayRefund(c echo.Context, ir payments.IdempotencyRequest, slot payments.Slot) error {
	r, err := a.svc.GetRefund(c.Request().Context(), slot.ResourceID)
	if err != nil {
		return err
	}
	status := slot.ResponseCode
	if ir.Kind == payments.IdempotencyIntentKey || (status != http.StatusCreated && status != http.StatusAccepted) {
		status = refundStatus(r)
	}
	return writeRefund(c, status, r, true)
}

// refundIntentKey is the business-intent key of a refund without an Idempotency-Key: the same
// payment and amount within one window of the service clock are one intent (a burst of
// retries); the next window is a new intent (a second partial refund of the same amount later
// on is a real request). The "refund/" prefix keeps it apart from create's "create/" keys in the
// client's intent namespace; the client is the row's scope.
func refundIntentKey(paymentID string, amount int64, now time.Time, window time.Duration) string {
	if window <= 0 {
		window = payments.DefaultIntentWindow
	}
	return fmt.Sprintf("refund/%s/%d/%s", paymentID, amount, now.UTC().Truncate(window).Format(time.RFC3339))
}

// refundRequestKey names the idempotency slot a refund request holds, for the core's refunds
// (request_key, unique per payment): whoever holds the slot — the first request or one that
// took it over — finds the same refund; a key reused after it expired (a new Since) is a new
// request and gets a new refund.
func refundRequestKey(ir payments.IdempotencyRequest, slot payments.Slot) string {
	return ir.ClientID + "/" + string(ir.Kind) + "/" + ir.Key + "/" + slot.Since.UTC().Format(time.RFC3339Nano)
}
