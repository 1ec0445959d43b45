package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Stuck: GET /finance/stuck?state=&currency=&flagged=&age=&sort=&after=, the finance workbench:
// active payments past their expected settle time, their totals per state and currency, keyset
// pages. An htmx request gets only the live part (totals and list) of the same component.
func (h *Console) Stuck(c echo.Context) error {
	f, err := stuckFilter(c.QueryParam("state"), c.QueryParam("currency"), c.QueryParam("flagged"),
		c.QueryParam("age"), c.QueryParam("sort"), c.QueryParam("after"))
	if err != nil {
		return err
	}
	p, err := h.svc.StuckSessions(c.Request().Context(), f)
	if err != nil {
		return err
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Stuck(views.StuckView{P: p}), views.StuckLive)
	}
	return render.HTML(c, http.StatusOK, views.Stuck(views.StuckView{Page: h.page(c, "Stuck money", "finance"), P: p}))
}
