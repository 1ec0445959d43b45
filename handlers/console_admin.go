package handlers

import (
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"pitlane/access"
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

// auditFilter is the audit page's filter from the query (actor, target), refused (400) when a
// value holds what PostgreSQL cannot take (a NUL, invalid UTF-8) before anything is sent: the
// CSV's status goes out with its first byte, so the database's refusal could only abort the
// download.
func auditFilter(c echo.Context) (payments.AuditFilter, error) {
	f := payments.AuditFilter{Actor: strings.TrimSpace(c.QueryParam("actor")), Target: strings.TrimSpace(c.QueryParam("target"))}
	for _, v := range []struct{ field, s string }{{"actor", f.Actor}, {"target", f.Target}} {
		if !utf8.ValidString(v.s) || strings.ContainsRune(v.s, 0) {
			return f, &payments.Error{Code: payments.EMALFORMED, Field: v.field,
				Message: "the " + v.field + " filter holds characters that cannot be stored (a NUL byte or invalid UTF-8)"}
		}
	}
	// As the log stores them: a staff member's email normalised (Sup@Example.com signs in as
	// sup@example.com), a payment's id in lower case; typed otherwise, the filter found nothing
	// (an outside review).
	for _, v := range []*string{&f.Actor, &f.Target} {
		if strings.Contains(*v, "@") && !strings.Contains(*v, ":") {
			*v = access.NormalizeEmail(*v) // a staff member (an actor, or the target of a user change)
		} else if id, ok := CanonicalUUID(*v); ok {
			*v = id
		}
	}
	return f, nil
}

// Audit: GET /admin/audit[?actor=…&target=…], the newest 200 entries under the filter.
func (h *Console) Audit(c echo.Context) error {
	f, err := auditFilter(c)
	if err != nil {
		return err
	}
	v := views.AuditView{Actor: f.Actor, Target: f.Target}
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
	f, err := auditFilter(c)
	if err != nil {
		return err
	}
	return h.streamCSV(c, "audit", payments.AuditAuditExport, "audit_log", f.Query(),
		[]string{"id", "at", "actor", "role", "action", "target", "detail"},
		func(write func([]string) error) (int, error) {
			return h.svc.ExportAudit(c.Request().Context(), f, func(e payments.AuditEntry) error {
				return write([]string{strconv.FormatInt(e.ID, 10), e.At.UTC().Format(time.RFC3339Nano), csvText(e.Actor), e.Role,
					e.Action, csvText(e.Target), csvText(e.Detail)})
			})
		})
}
