package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Ledger: GET /finance/ledger, totals per currency and the newest entries.
func (h *Console) Ledger(c echo.Context) error {
	if err := h.ready(); err != nil {
		return err
	}
	entries, totals, err := h.svc.Ledger(c.Request().Context())
	if err != nil {
		return err
	}
	return render.HTML(c, http.StatusOK, views.Ledger(views.LedgerView{Page: h.page(c, "Ledger", "finance"), Entries: entries, Totals: totals}))
}
