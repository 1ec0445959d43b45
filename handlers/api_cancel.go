package handlers

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

type challengeJSON struct {
	ChallengeID string    `json:"challenge_id"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// CancelPayment: POST /api/v1/payments/{id}/cancel → 202 {"challenge_id","expires_at"}: a
// one-time code went to the customer; 409 when the payment is not cancelable; 404.
func (a *API) CancelPayment(c echo.Context) error {
	if err := parseEmpty(c.Request()); err != nil {
		return err
	}
	ch, err := a.svc.RequestCancel(c.Request().Context(), actor(c), PathParam(c, "id"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusAccepted, challengeJSON{ChallengeID: ch.ID, ExpiresAt: ch.ExpiresAt.UTC().Truncate(time.Microsecond)}) // as stored, like every other timestamp
}

// ConfirmCancel: POST /api/v1/payments/{id}/cancel/confirm {"challenge_id","code"} → 202 the
// payment in Canceling or later; the same code again → 200 with the same payment and no second
// reverse; wrong code 422; expired 410; attempts used up 429; not cancelable 409.
func (a *API) ConfirmCancel(c echo.Context) error {
	req, err := parseConfirm(c.Request())
	if err != nil {
		return err
	}
	res, err := a.svc.ConfirmCancel(c.Request().Context(), actor(c), PathParam(c, "id"), req.ChallengeID, req.Code)
	if err != nil {
		return err
	}
	status := http.StatusAccepted
	if res.Replayed {
		status = http.StatusOK
	}
	return a.writePayment(c, status, res.Session)
}
