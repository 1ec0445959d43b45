package handlers

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Outbox: GET /outbox[?payment=…], messages to customers. Admins only (the route says so):
// a code's message holds the code until it is delivered, and whoever sees it here may not
// confirm it (payments.Service.Outbox records them).
func (h *Console) Outbox(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	msgs, err := h.svc.Outbox(c.Request().Context(), st, c.QueryParam("payment"))
	if err != nil {
		return err
	}
	return render.HTML(c, http.StatusOK, views.Outbox(views.OutboxView{Page: h.page(c, "Outbox", "outbox"), Messages: msgs}))
}

// Audit: GET /admin/audit[?actor=…&target=…].
func (h *Console) Audit(c echo.Context) error {
	v := views.AuditView{Actor: strings.TrimSpace(c.QueryParam("actor")), Target: strings.TrimSpace(c.QueryParam("target"))}
	var err error
	if v.Entries, err = h.svc.AuditLog(c.Request().Context(), payments.AuditFilter{Actor: v.Actor, Target: v.Target}); err != nil {
		return err
	}
	v.Page = h.page(c, "Audit log", "audit")
	return render.HTML(c, http.StatusOK, views.Audit(v))
}
