package handlers

import (
	"net/http"
	"strconv"
	"strings"
	"time"

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

// auditFilter is the audit page's filter from the query (actor, target).
func auditFilter(c echo.Context) payments.AuditFilter {
	return payments.AuditFilter{Actor: strings.TrimSpace(c.QueryParam("actor")), Target: strings.TrimSpace(c.QueryParam("target"))}
}

// Audit: GET /admin/audit[?actor=…&target=…], the newest 200 entries under the filter.
func (h *Console) Audit(c echo.Context) error {
	f := auditFilter(c)
	v := views.AuditView{Actor: f.Actor, Target: f.Target}
	var err error
	if v.Entries, err = h.svc.AuditLog(c.Request().Context(), f); err != nil {
		return err
	}
	v.Page = h.page(c, "Audit log", "audit")
	return render.HTML(c, http.StatusOK, views.Audit(v))
}

// AuditCSV: GET /admin/audit.csv?actor=&target=, every audit entry under the filter, oldest
// first, streamed (payments.ExportAudit): the page shows the newest 200, an auditor needs all
// of them. Text cells are kept from being read as formulas (details carry what staff typed).
// Audited itself, with the row count.
func (h *Console) AuditCSV(c echo.Context) error {
	f := auditFilter(c)
	return h.streamCSV(c, "audit", payments.AuditAuditExport, "audit_log", f.Query(),
		[]string{"id", "at", "actor", "role", "action", "target", "detail"},
		func(write func([]string) error) (int, error) {
			return h.svc.ExportAudit(c.Request().Context(), f, func(e payments.AuditEntry) error {
				return write([]string{strconv.FormatInt(e.ID, 10), e.At.UTC().Format(time.RFC3339Nano), csvText(e.Actor), e.Role,
					e.Action, csvText(e.Target), csvText(e.Detail)})
			})
		})
}
