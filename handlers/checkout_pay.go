package handlers

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// Pay: POST /checkout/:order_id, one Pay click. The form carries the intent key the page
// embedded; every retry of the click (double click, resubmit) carries the same one, so it
// reaches the same session and at most one registration at the gateway
// (payments.CheckoutPay). Success goes to the gateway's payment page; a click whose first
// request is still running goes to the order's page, which follows it.
func (h *Checkout) Pay(c echo.Context) error {
	id, err := h.orderID(c)
	if err != nil {
		return err
	}
	key := c.FormValue("intent")
	amount, ok := parseMinorAmount(c.FormValue("amount"))
	if !ok {
		return h.show(c, id, false, http.StatusUnprocessableEntity, "The payment form is damaged; please start again from the shop.")
	}
	in := payments.CreateInput{OrderID: id, Amount: amount, Currency: strings.ToUpper(c.FormValue("currency")),
		CustomerContact: strings.TrimSpace(c.FormValue("contact"))}
	res, err := h.svc.CheckoutPay(c.Request().Context(), key, in, h.staleAfter)
	follow := "/checkout/" + url.PathEscape(id) + "?intent=" + url.QueryEscape(key)
	switch code := payments.ErrorCode(err); {
	case err == nil:
	case code == payments.EBUSY:
		return c.Redirect(http.StatusSeeOther, follow)
	case code == payments.EINTERNAL:
		return err
	default:
		status := http.StatusConflict
		if code == payments.EINVALID {
			status = http.StatusUnprocessableEntity
		}
		return h.show(c, id, false, status, payments.ErrorMessage(err))
	}
	s := res.Session
	if s.Status == payments.StatusRegistered && s.ConfirmationURL != "" {
		return c.Redirect(http.StatusSeeOther, s.ConfirmationURL)
	}
	return c.Redirect(http.StatusSeeOther, follow)
}
