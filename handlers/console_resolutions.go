package handlers

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Resolutions: GET /finance/resolutions, four-eyes proposals: those waiting for a second person
// (oldest first, at most resolutionsShown, and how many wait in all) and the latest decided (by
// when they were decided). An htmx request gets only the live part of the same component.
func (h *Console) Resolutions(c echo.Context) error {
	v, err := h.resolutionsView(c.Request().Context())
	if err != nil {
		return err
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Resolutions(v), views.ResolutionsLive)
	}
	v.Page = h.page(c, "Manual resolutions", "finance")
	return render.HTML(c, http.StatusOK, views.Resolutions(v))
}

// resolutionsView is the four-eyes page's lists: the oldest waiting (and how many wait) and the
// latest decided.
func (h *Console) resolutionsView(ctx context.Context) (views.ResolutionsView, error) {
	pending, err := h.svc.ListResolutions(ctx, payments.ResolutionFilter{Queue: true, Limit: resolutionsShown})
	if err != nil {
		return views.ResolutionsView{}, err
	}
	waiting := len(pending)
	if waiting == resolutionsShown {
		if waiting, err = h.svc.WaitingResolutions(ctx); err != nil {
			return views.ResolutionsView{}, err
		}
	}
	decided, err := h.svc.ListResolutions(ctx, payments.ResolutionFilter{Decided: true, Limit: 100})
	if err != nil {
		return views.ResolutionsView{}, err
	}
	return views.ResolutionsView{Pending: pending, Waiting: waiting, Decided: decided}, nil
}

// resolutionsShown bounds the waiting list on the page (the count names the rest).
const resolutionsShown = 500
