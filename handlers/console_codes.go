package handlers

import (
	"strconv"

	"github.com/labstack/echo/v4"
)

// UnlockCodes: POST /payments/:id/codes/unlock (finance, admin), with a reason. Lifts the lock of
// a payment whose one-time codes had too many wrong guesses (payments.UnlockCodes: audited in the
// same transaction; a payment that is not locked is refused). Back to the payment's page.
func (h *Console) UnlockCodes(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	id := c.Param("id")
	n, err := h.svc.UnlockCodes(c.Request().Context(), st, id, c.FormValue("reason"))
	return h.done(c, "/payments/"+id, "Codes unlocked: "+strconv.Itoa(n)+" wrong codes cleared. Support can send the customer a new code.", err)
}
