package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Dashboard: GET /, state counts, stuck sessions, open cases, leases. The live region's refresh
// (an htmx request of the same URL) gets only the live fragment of the same component.
func (h *Console) Dashboard(c echo.Context) error {
	d, err := h.svc.Dashboard(c.Request().Context())
	if err != nil {
		return err
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Dashboard(views.DashboardView{D: d}), views.DashboardLive)
	}
	return render.HTML(c, http.StatusOK, views.Dashboard(views.DashboardView{Page: h.page(c, "Dashboard", "dashboard"), D: d}))
}
