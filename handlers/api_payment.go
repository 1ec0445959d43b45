package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// GetPayment: GET /api/v1/payments/{id} → 200 the payment object; 404.
func (a *API) GetPayment(c echo.Context) error {
	sess, err := a.svc.Get(c.Request().Context(), PathParam(c, "id"))
	if err != nil {
		return err
	}
	return a.writePayment(c, http.StatusOK, sess)
}
