package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Ledger: GET /finance/ledger?from=&to=&currency=&type=, the trial balance per currency and the
// newest entries under the filter, with a link to the same entries as CSV. An htmx request gets
// only the live part (balance and entries).
func (h *Console) Ledger(c echo.Context) error {
	form := ledgerForm(c)
	f, err := ledgerFilter(form)
	if payments.ErrorCode(err) == payments.EINVALID && !htmx(c) {
		// The filter as typed, with what is wrong tied to its field (422): a bare error page
		// lost the form and everything in it (an outside review, a11y).
		form.Error, form.Field = payments.ErrorMessage(err), errorField(err)
		v := views.LedgerView{Filter: form, Page: h.page(c, "Ledger", "finance")}
		return render.HTML(c, http.StatusUnprocessableEntity, views.Ledger(v))
	}
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
	v := views.LedgerView{Filter: form, Entries: entries, Totals: totals}
	// A range that ends is final once everything dated before its end is written; one without
	// an end never is (Open).
	if now := h.svc.Now(); f.To.IsZero() {
		v.Open = true
	} else if final := h.svc.LedgerFinalAt(f.To); final.After(now) {
		v.FinalAt = &final
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Ledger(v), views.LedgerLive)
	}
	v.Page = h.page(c, "Ledger", "finance")
	return render.HTML(c, http.StatusOK, views.Ledger(v))
}

// ledgerForm is the ledger filter of the query string, as typed.
func ledgerForm(c echo.Context) views.LedgerFilterForm {
	return views.LedgerFilterForm{From: c.QueryParam("from"), To: c.QueryParam("to"), Currency: c.QueryParam("currency"), Type: c.QueryParam("type")}
}
