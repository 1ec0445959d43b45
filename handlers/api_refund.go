package handlers

import (
	"context"
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
// Idempotency is create's (payments.Idempotency.Run): validation first; with an Idempotency-Key
// a completed key replays the refund it created AS IT IS NOW with the first answer's status and
// Idempotent-Replayed: true; without one, the intent (payment, amount; 5 minutes sliding from
// the last identical request, from any API client) is the key. Failures without effect (404,
// 409, 422) release a client's key (an intent keeps its use: Idempotency.giveUp); an uncertain
// one abandons it to the same request. While a client key's first request
// still runs: 409 + Retry-After. A keyless refund's intent is completed with the refund in the
// refund's claim (Bind), so an identical keyless request that arrives while the first one waits
// for the gateway replays the Pending refund (202): the contract's "is the same refund". One that
// arrives while the first is still before or inside its claim runs the refund itself
// (BusyRunsEffect) under the first one's RequestKey (the slot's Since is the holder's use): under
// the payment's locks whichever claims first makes the refund and the other finds it, never a
// 409 and never a second refund.
//
// The core binds the refund to RequestKey, derived from the key slot (client, kind, key, the
// use's start): a request that takes the slot over after its first holder died or gave up finds
// the refund the first one claimed instead of making a second.
func (a *API) CreateRefund(c echo.Context) error {
	req, err := parseRefund(c.Request(), PathParam(c, "id"))
	if err != nil {
		return err
	}
	ir := payments.IdempotencyRequest{ClientID: ClientFrom(c).ID, Method: http.MethodPost, Path: req.Path}
	if req.Key != "" {
		ir.Kind, ir.Key, ir.Fingerprint = payments.IdempotencyClientKey, req.Key, req.Fingerprint
	} else {
		// As for create: the intent is the operation, so its fingerprint is the intent key. It is
		// the shop's, not this client's: one row for every client (RefundIntentOwner).
		ir.ClientID = payments.RefundIntentOwner
		ir.Kind, ir.Key, ir.BusyRunsEffect = payments.IdempotencyIntentKey, payments.RefundIntentKey(req.PaymentID, req.Amount), true
		ir.Fingerprint = payments.Fingerprint(http.MethodPost, req.Path, []byte(ir.Key))
	}
	var refund payments.Refund
	out, err := a.idem.Run(c.Request().Context(), ir, func(ctx context.Context, slot payments.Slot) (string, int, error) {
		res, err := a.svc.CreateRefund(ctx, actor(c), payments.RefundInput{
			PaymentID: req.PaymentID, Amount: req.Amount, RequestKey: refundRequestKey(ir, slot), Bind: slot.Binding,
		})
		refund = res.Refund
		return res.Refund.ID, refundStatus(res.Refund), err
	})
	if err != nil {
		return err
	}
	if out.Replayed {
		return a.replayRefund(c, ir, out)
	}
	return writeRefund(c, out.Status, refund, false)
}

// GetRefund: GET /api/v1/refunds/{id} → 200 the refund as it is now; 404.
func (a *API) GetRefund(c echo.Context) error {
	r, err := a.svc.GetRefund(c.Request().Context(), PathParam(c, "id"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, toRefundJSON(r))
}

// refundListJSON is a payment's refunds.
type refundListJSON struct {
	PaymentID string       `json:"payment_id"`
	Refunds   []refundJSON `json:"refunds"`
	HasMore   bool         `json:"has_more"`
}

// ListRefunds: GET /api/v1/payments/{id}/refunds → 200 the payment's refunds as they are now,
// oldest first (at most payments.MaxRefundsListed; has_more says whether there are others);
// 404 no such payment. What a shop reconciles its refunds with, or finds a refund whose
// answer it lost by.
func (a *API) ListRefunds(c echo.Context) error {
	refunds, more, err := a.svc.RefundsOf(c.Request().Context(), PathParam(c, "id"))
	if err != nil {
		return err
	}
	id := PathParam(c, "id")
	if u, ok := CanonicalUUID(id); ok {
		id = u // as every refund's payment_id says it, whatever case the path used
	}
	out := refundListJSON{PaymentID: id, Refunds: make([]refundJSON, len(refunds)), HasMore: more}
	for i, r := range refunds {
		out.Refunds[i] = toRefundJSON(r)
	}
	return writeJSON(c, http.StatusOK, out)
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
func (a *API) replayRefund(c echo.Context, ir payments.IdempotencyRequest, out payments.Outcome) error {
	r, err := a.svc.GetRefund(c.Request().Context(), out.ResourceID)
	if err != nil {
		return err
	}
	status := out.Status
	if ir.Kind == payments.IdempotencyIntentKey || (status != http.StatusCreated && status != http.StatusAccepted) {
		status = refundStatus(r)
	}
	return writeRefund(c, status, r, true)
}

// refundRequestKey names the idempotency slot a refund request holds, for the core's refunds
// (request_key, unique per payment): whoever holds the slot — the first request or one that
// took it over — finds the same refund; a key reused after it expired (a new Since) is a new
// request and gets a new refund.
func refundRequestKey(ir payments.IdempotencyRequest, slot payments.Slot) string {
	return ir.ClientID + "/" + string(ir.Kind) + "/" + ir.Key + "/" + slot.Since.UTC().Format(time.RFC3339Nano)
}
