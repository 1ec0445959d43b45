package handlers

import (
	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// CheckPayment: POST /payments/:id/check. Ask the gateway and apply its answer exactly once
// (payments.Check); audited with the outcome.
func (h *Console) CheckPayment(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	id := c.Param("id")
	before, err := h.svc.Get(c.Request().Context(), id)
	if err != nil {
		return err
	}
	_, detail, err := h.svc.CheckAudited(c.Request().Context(), st.Actor(), id, before.Status)
	if err != nil {
		detail = outcome(err)
	}
	h.audit(c, payments.AuditPaymentCheck, id, detail)
	return h.done(c, "/payments/"+id, "Checked with the gateway: "+detail+".", err)
}
