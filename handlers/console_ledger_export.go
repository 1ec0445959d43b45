package handlers

import (
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// LedgerCSV: GET /finance/ledger.csv?from=&to=&currency=&type=, every entry under the filter,
// oldest first, streamed a batch at a time (payments.ExportLedger: no connection held while the
// browser reads). A bad filter is
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
