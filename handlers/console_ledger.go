package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Ledger: GET /finance/ledger?from=&to=&currency=&type=, the trial balance per currency and the
// newest entries under the filter, with a link to the same entries as CSV.
func (h *Console) Ledger(c echo.Context) error {
	form := ledgerForm(c)
	f, err := ledgerFilter(form)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	totals, err := h.svc.TrialBalance(ctx, f)
	if err != nil {
		return err
	}
	entries, err := h.svc.LedgerEntries(ctx, f)
	if err != nil {
		return err
	}
	return render.HTML(c, http.StatusOK, views.Ledger(views.LedgerView{Page: h.page(c, "Ledger", "finance"), Filter: form,
		Entries: entries, Totals: totals}))
}

// ledgerForm is the ledger filter of the query string, as typed.
func ledgerForm(c echo.Context) views.LedgerFilterForm {
	return views.LedgerFilterForm{From: c.QueryParam("from"), To: c.QueryParam("to"), Currency: c.QueryParam("currency"), Type: c.QueryParam("type")}
}
