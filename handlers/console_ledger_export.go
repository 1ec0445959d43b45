package handlers

import (
	"encoding/csv"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// ledgerFlushEvery is how many CSV rows go out per flush: the browser sees the download start
// at once and the server holds no more than this many rows in its buffer.
const ledgerFlushEvery = 500

// LedgerCSV: GET /finance/ledger.csv?from=&to=&currency=&type=, every entry under the filter,
// oldest first, streamed as PostgreSQL sends the rows (payments.ExportLedger). A bad filter is
// refused before anything is sent. A failure half-way aborts the response (the download fails
// visibly) rather than ending it as if the file were whole. Audited with the row count.
func (h *Console) LedgerCSV(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	form := ledgerForm(c)
	f, err := ledgerFilter(form)
	if err != nil {
		return err
	}
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	w.Header().Set(echo.HeaderContentDisposition, `attachment; filename="pitlane-ledger-`+h.svc.Now().UTC().Format("20060102-150405")+`.csv"`)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"id", "created_at", "entry_type", "order_id", "payment_id", "refund_id", "currency", "amount_minor", "amount"})
	rows := 0
	n, err := h.svc.ExportLedger(c.Request().Context(), f, func(e payments.ExportedEntry) error {
		if err := cw.Write([]string{strconv.FormatInt(e.ID, 10), e.CreatedAt.UTC().Format(time.RFC3339Nano), e.Type,
			csvText(e.OrderID), e.SessionID, e.RefundID, e.Currency, strconv.FormatInt(e.Amount, 10),
			payments.FormatMinor(e.Amount, e.Currency)}); err != nil {
			return err
		}
		if rows++; rows%ledgerFlushEvery == 0 {
			cw.Flush()
			w.Flush()
		}
		return cw.Error()
	})
	cw.Flush()
	if err == nil {
		err = cw.Error()
	}
	detail := "rows " + strconv.Itoa(n) + ", filter " + form.Query()
	if err != nil {
		detail += ", aborted: " + err.Error()
	}
	if aerr := h.svc.RecordAudit(c.Request().Context(), payments.AuditEntry{Actor: st.Email, Role: string(st.Role),
		Action: payments.AuditLedgerExport, Target: "ledger", Detail: detail}); aerr != nil {
		h.log.Error("audit", "action", payments.AuditLedgerExport, "err", aerr)
	}
	if err != nil {
		h.log.Error("ledger export aborted", "rows", n, "err", err)
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
