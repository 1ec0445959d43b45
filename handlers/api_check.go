package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// CheckPayment: POST /api/v1/payments/{id}/check → 200 the payment after asking the gateway and
// applying its answer exactly once (the core's Check); 404; 503 + Retry-After when the gateway
// did not answer (the payment is unchanged).
func (a *API) CheckPayment(c echo.Context) error {
	if err := parseEmpty(c.Request()); err != nil {
		return err
	}
	sess, err := a.svc.Check(c.Request().Context(), actor(c), PathParam(c, "id"))
	if err != nil {
		return err
	}
	return a.writePayment(c, http.StatusOK, sess)
}
