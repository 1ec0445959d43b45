package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Resolutions: GET /finance/resolutions, four-eyes proposals: those waiting for a second person
// and the latest decided. An htmx request gets only the live part of the same component.
func (h *Console) Resolutions(c echo.Context) error {
	ctx := c.Request().Context()
	pending, err := h.svc.ListResolutions(ctx, payments.ResolutionFilter{State: payments.ResolutionProposed, Limit: 500})
	if err != nil {
		return err
	}
	all, err := h.svc.ListResolutions(ctx, payments.ResolutionFilter{Limit: 100})
	if err != nil {
		return err
	}
	v := views.ResolutionsView{Pending: pending}
	for _, r := range all {
		if !r.Pending() {
			v.Decided = append(v.Decided, r)
		}
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Resolutions(v), views.ResolutionsLive)
	}
	v.Page = h.page(c, "Manual resolutions", "finance")
	return render.HTML(c, http.StatusOK, views.Resolutions(v))
}
