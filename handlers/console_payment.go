package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Payment: GET /payments/:id[?challenge=…], one payment with everything known about it; with
// a challenge, the form to enter the customer's cancel code. A live refresh (static/live.js)
// gets the payment block alone, without the layout (and without taking the flash meant for the
// page an action redirects to).
func (h *Console) Payment(c echo.Context) error {
	if err := h.ready(); err != nil {
		return err
	}
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
	if liveRefresh(c) {
		return render.Fragments(c, http.StatusOK, views.Payment(v), views.PageContent)
	}
	v.Page = h.page(c, "Payment "+views.Short(d.Session.ID), "payments")
	return render.HTML(c, http.StatusOK, views.Payment(v))
}
