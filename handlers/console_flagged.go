package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Flagged: GET /finance/flagged, sessions the patrol gave up on. An htmx request gets only the
// live list.
func (h *Console) Flagged(c echo.Context) error {
	list, err := h.svc.ListFlagged(c.Request().Context())
	if err != nil {
		return err
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Flagged(views.FlaggedView{Sessions: list}), views.FlaggedLive)
	}
	return render.HTML(c, http.StatusOK, views.Flagged(views.FlaggedView{Page: h.page(c, "Flagged sessions", "finance"), Sessions: list}))
}

// RetryFlagged: POST /finance/flagged/:id/retry. Clears the flag and makes the session due now
// with a fresh patrol schedule; audited in the same transaction (payments.RetryFlagged).
func (h *Console) RetryFlagged(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	s, err := h.svc.RetryFlagged(c.Request().Context(), st, c.Param("id"))
	msg := ""
	if err == nil {
		msg = "Payment " + views.Short(s.ID) + " of order " + s.OrderID + " is back with the patrol."
	}
	return h.done(c, "/finance/flagged", msg, err)
}
