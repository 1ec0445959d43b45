package handlers

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Payments: GET /payments?q=…&status=…&before=…, the searchable list. An htmx request (its live
// region refreshing) gets only the results of the same component.
func (h *Console) Payments(c echo.Context) error {
	v := views.PaymentsView{Query: strings.TrimSpace(c.QueryParam("q")), Status: c.QueryParam("status")}
	list, err := h.svc.ListPayments(c.Request().Context(), payments.PaymentFilter{
		Query: v.Query, Status: payments.Status(v.Status), Before: c.QueryParam("before"),
	})
	if err != nil {
		return err
	}
	v.List = list
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Payments(v), views.PaymentsLive)
	}
	v.Page = h.page(c, "Payments", "payments")
	return render.HTML(c, http.StatusOK, views.Payments(v))
}
