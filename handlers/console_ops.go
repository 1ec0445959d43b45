package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Ops: GET /ops, the Operations page — sessions by state, the gateway's calls and latency, the
// sweeper's backlog and each replica's patrol, drawn as SVG on the server. An htmx request of
// the same URL gets only the charts (the views.OpsLive fragment), for a live update.
func (h *Console) Ops(c echo.Context) error {
	oc, err := h.svc.OpsCharts(c.Request().Context())
	if err != nil {
		return err
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Ops(views.OpsView{C: oc}), views.OpsLive)
	}
	return render.HTML(c, http.StatusOK, views.Ops(views.OpsView{Page: h.page(c, "Operations", "ops"), C: oc}))
}

// RetryEventsWebhook: POST /ops/events-webhook/retry (admins). Ends the events webhook's wait
// after failed POSTs, so the next round sends at once; audited (payments.RetryEventsWebhookNow).
func (h *Console) RetryEventsWebhook(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	err = h.svc.RetryEventsWebhookNow(c.Request().Context(), st)
	return h.done(c, "/ops", "The events webhook sends again on the next round.", err)
}
