package handlers

import (
	"encoding/csv"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// csvFlushEvery is how many CSV rows go out per flush: the browser sees the download start at
// once and the server holds no more than this many rows in its buffer.
const csvFlushEvery = 500

// LedgerCSV: GET /finance/ledger.csv?from=&to=&currency=&type=, every entry under the filter,
// oldest first, streamed as PostgreSQL sends the rows (payments.ExportLedger). A bad filter is
// refused before anything is sent. A failure half-way aborts the response (the download fails
// visibly) rather than ending it as if the file were whole. Audited with the row count.
func (h *Console) LedgerCSV(c echo.Context) error {
	form := ledgerForm(c)
	f, err := ledgerFilter(form)
	if err != nil {
		return err
	}
	return h.streamCSV(c, "ledger", payments.AuditLedgerExport, "ledger", form.Query(),
		[]string{"id", "created_at", "entry_type", "order_id", "payment_id", "refund_id", "currency", "amount_minor", "amount"},
		func(write func([]string) error) (int, error) {
			return h.svc.ExportLedger(c.Request().Context(), f, func(e payments.ExportedEntry) error {
				return write([]string{strconv.FormatInt(e.ID, 10), e.CreatedAt.UTC().Format(time.RFC3339Nano), e.Type,
					csvText(e.OrderID), e.SessionID, e.RefundID, e.Currency, strconv.FormatInt(e.Amount, 10),
					payments.FormatMinor(e.Amount, e.Currency)})
			})
		})
}

// AuditCSV: GET /admin/audit.csv?actor=&target=, every audit entry under the filter, oldest
// first, streamed (payments.ExportAudit): the page shows the newest 200, an auditor needs all
// of them. Text cells are kept from being read as formulas (details carry what staff typed).
// Audited itself, with the row count.
func (h *Console) AuditCSV(c echo.Context) error {
	f := payments.AuditFilter{Actor: strings.TrimSpace(c.QueryParam("actor")), Target: strings.TrimSpace(c.QueryParam("target"))}
	filter := url.Values{}
	if f.Actor != "" {
		filter.Set("actor", f.Actor)
	}
	if f.Target != "" {
		filter.Set("target", f.Target)
	}
	return h.streamCSV(c, "audit", payments.AuditAuditExport, "audit_log", filter.Encode(),
		[]string{"id", "at", "actor", "role", "action", "target", "detail"},
		func(write func([]string) error) (int, error) {
			return h.svc.ExportAudit(c.Request().Context(), f, func(e payments.AuditEntry) error {
				return write([]string{strconv.FormatInt(e.ID, 10), e.At.UTC().Format(time.RFC3339Nano), csvText(e.Actor), e.Role,
					e.Action, csvText(e.Target), csvText(e.Detail)})
			})
		})
}

// streamCSV sends a CSV download named pitlane-<name>-<time>.csv: the header, then each row
// export writes, flushed every csvFlushEvery rows. The export is audited (action, target, the
// row count and the filter). A failure once the status is sent aborts the response, so the
// download fails visibly instead of ending as if the file were whole.
func (h *Console) streamCSV(c echo.Context, name, action, target, filter string, header []string,
	export func(write func([]string) error) (int, error)) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	w.Header().Set(echo.HeaderContentDisposition, `attachment; filename="pitlane-`+name+`-`+h.svc.Now().UTC().Format("20060102-150405")+`.csv"`)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	cw := csv.NewWriter(w)
	_ = cw.Write(header)
	rows := 0
	n, err := export(func(rec []string) error {
		if err := cw.Write(rec); err != nil {
			return err
		}
		if rows++; rows%csvFlushEvery == 0 {
			cw.Flush()
			w.Flush()
		}
		return cw.Error()
	})
	cw.Flush()
	if err == nil {
		err = cw.Error()
	}
	detail := "rows " + strconv.Itoa(n) + ", filter " + filter
	if err != nil {
		detail += ", aborted: " + err.Error()
	}
	if aerr := h.svc.RecordAudit(c.Request().Context(), payments.AuditEntry{Actor: st.Email, Role: string(st.Role),
		Action: action, Target: target, Detail: detail}); aerr != nil {
		h.log.Error("audit", "action", action, "err", aerr)
	}
	if err != nil {
		h.log.Error(name+" export aborted", "rows", n, "err", err)
		panic(http.ErrAbortHandler) // the status is sent: only a broken transfer says "incomplete"
	}
	w.Flush()
	return nil
}

// csvText keeps a text cell from being read as a formula by a spreadsheet (=, +, -, @ first).
func csvText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}
