package handlers

import (
	"errors"
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
//
// The form's amount and currency are the customer's to edit, so they are checked before
// anything is created: the form's sig must sign them (the checkout link they came from), or
// they must be the order's last payment's (the page's retry form after a decline). Otherwise
// 422 and nothing is written.
func (h *Checkout) Pay(c echo.Context) error {
	id, err := h.orderID(c)
	if err != nil {
		return err
	}
	key := c.FormValue("intent")
	_, verr := h.verifiedOffer(id, c.FormValue("amount"), c.FormValue("currency"), c.FormValue("exp"), c.FormValue("sig"))
	if payments.ErrorCode(verr) == payments.EEXPIRED {
		// A form rendered from a link that has expired since: the link's time is up for the
		// click too (nothing is created), whatever the amount.
		return h.refuse(c, id, verr)
	}
	if verr != nil && !h.svc.VerifyOrderPageToken(id, c.FormValue(payments.OrderPageParam)) {
		// Neither the link's signature nor the order's page token (the form carries both): a
		// form not made by the order's page. Nothing is started, and nothing of the order shown.
		return h.refuse(c, id, verr)
	}
	amount, ok := parseMinorAmount(c.FormValue("amount"))
	if !ok {
		return h.show(c, id, false, http.StatusUnprocessableEntity, "The payment form is damaged; please start again from the shop.")
	}
	in := payments.CreateInput{OrderID: id, Amount: amount, Currency: strings.ToUpper(c.FormValue("currency")),
		CustomerContact: strings.TrimSpace(c.FormValue("contact"))}
	if verr != nil {
		retry, err := h.isLastPayment(c, in)
		if err != nil {
			return err
		}
		if !retry {
			return h.show(c, id, false, http.StatusUnprocessableEntity,
				"This payment form was changed: its amount or currency is not what the shop asked for, so nothing was started. Please go back to the shop and start the payment again.")
		}
	}
	res, err := h.svc.CheckoutPay(c.Request().Context(), key, in, h.staleAfter)
	follow := h.svc.OrderPagePath(id, url.Values{"intent": {key}}) // with the page token: the follow-up page opens for this customer
	switch code := payments.ErrorCode(err); {
	case err == nil:
	case code == payments.EBUSY:
		return c.Redirect(http.StatusSeeOther, follow)
	case errors.Is(err, payments.ErrLinkReplaced):
		// The shop made a newer link for another amount since this form was rendered: nothing
		// is started, and the page says so (409).
		return h.refuse(c, id, err)
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
	if s.Status == payments.StatusRegistered && h.svc.TrustedConfirmationURL(s.ConfirmationURL) {
		return c.Redirect(http.StatusSeeOther, s.ConfirmationURL)
	}
	return c.Redirect(http.StatusSeeOther, follow)
}

// refuse answers a Pay click whose link pays nothing with the refusal page (refusedLink).
func (h *Checkout) refuse(c echo.Context, orderID string, err error) error {
	state, status := refusedLink(err, http.StatusOK)
	return h.render(c, status, h.view(orderID, state))
}

// isLastPayment reports whether in has the amount and currency of the order's last payment:
// what the page offers, without a link, to retry after a decline.
func (h *Checkout) isLastPayment(c echo.Context, in payments.CreateInput) (bool, error) {
	_, sessions, err := h.svc.GetOrder(c.Request().Context(), in.OrderID)
	switch {
	case payments.ErrorCode(err) == payments.ENOTFOUND:
		return false, nil
	case err != nil:
		return false, err
	case len(sessions) == 0:
		return false, nil
	}
	last := sessions[len(sessions)-1]
	return last.Amount == in.Amount && last.Currency == in.Currency, nil
}
