package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Payment: GET /payments/:id[?challenge=…], one payment with everything known about it; with
// a challenge, the form to enter the customer's cancel code.
func (h *Console) Payment(c echo.Context) error {
	d, err := h.svc.PaymentDetail(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	v := views.PaymentView{D: d}
	if id := c.QueryParam("challenge"); id != "" {
		if ch, ok := d.Challenge(id); ok {
			v.Challenge = &ch
		}
	}
	v.Page = h.page(c, "Payment "+views.Short(d.Session.ID), "payments")
	return render.HTML(c, http.StatusOK, views.Payment(v))
}
