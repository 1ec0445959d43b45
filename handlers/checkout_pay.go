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
// they must be the order's last payment's (the page's retry form after a decline, with the
// order's page token). Otherwise 422 and nothing is written.
//
// Either has a time: the link's expiry, or for the retry the links that priced the order
// (payments.CheckoutRetry). A form whose time is up starts nothing, but its click may have
// started something already: a resubmit arriving while the first request registers the payment
// (or after it did) is that click, and follows it (payments.CheckoutReplay). Only a click that
// started nothing is refused (410, or 409 when the price was replaced).
func (h *Checkout) Pay(c echo.Context) error {
	id, err := h.orderID(c)
	if err != nil {
		return err
	}
	key := c.FormValue("intent")
	offer, verr := h.verifiedOffer(id, linkForm(c))
	genuine := verr == nil || payments.ErrorCode(verr) == payments.EEXPIRED // a link of this order made it
	if !genuine && !h.svc.VerifyOrderPageToken(id, c.FormValue(payments.OrderPageParam)) {
		// Neither the link's signature nor the order's page token (the form carries both): a
		// form not made by the order's page. Nothing is started, and nothing of the order shown.
		return h.refuse(c, id, verr)
	}
	// What the answer shows: the link the form came from, or (a retry form) the order's page.
	page := url.Values{}
	if genuine {
		page = formLink(c)
	}
	amount, ok := parseMinorAmount(c.FormValue("amount"))
	if !ok {
		return h.show(c, page, id, false, http.StatusUnprocessableEntity, "The payment form is damaged; please start again from the shop.")
	}
	in := payments.CreateInput{OrderID: id, Amount: amount, Currency: strings.ToUpper(c.FormValue("currency")),
		CustomerContact: strings.TrimSpace(c.FormValue("contact"))}
	if verr == nil && offer.gen != payments.NoLinkGeneration {
		in.CheckoutLinkGen = &offer.gen // the claim pays only while the price is of the link's run
	}
	// closed: why this form may no longer start a payment (nil: it may).
	var closed error
	switch {
	case verr != nil && genuine:
		closed = verr // the link has expired since the form was rendered
	case verr != nil:
		retry, err := h.isLastPayment(c, in)
		if err != nil {
			return h.payError(c, id, page, err)
		}
		if !retry {
			return h.show(c, page, id, false, http.StatusUnprocessableEntity,
				"This payment form was changed: its amount or currency is not what the shop asked for, so nothing was started. Please go back to the shop and start the payment again.")
		}
		closed = h.svc.CheckoutRetry(c.Request().Context(), id, in.Amount, in.Currency)
		if code := payments.ErrorCode(closed); code == payments.EINTERNAL || code == payments.EUNAVAIL {
			return h.payError(c, id, page, closed)
		}
	}
	var res payments.CheckoutPayResult
	if closed != nil {
		// Look the click up before refusing it: its first request may be registering the payment
		// right now (or have done so) — "expired, nothing was charged" would be untrue.
		res, err = h.svc.CheckoutReplay(c.Request().Context(), key, in)
		if payments.ErrorCode(err) == payments.ENOTFOUND {
			return h.closed(c, id, closed)
		}
	} else {
		res, err = h.svc.CheckoutPay(c.Request().Context(), key, in, h.staleAfter)
	}
	if err != nil {
		return h.payError(c, id, page, err)
	}
	if bank, err := h.toBank(c, res.Session); err != nil {
		return h.payError(c, id, page, err)
	} else if bank {
		return nil
	}
	return c.Redirect(http.StatusSeeOther, h.follow(id, key, page))
}

// follow is the order's page following the click key (with the page token: the follow-up page
// opens for this customer), and the link the form came from (page; none for a retry form): when
// the click ends without a payment (its first request failed, a double click's second one is
// what the browser shows), the page is the link's again, with a Pay form — without the link it
// called a genuine link "incomplete or changed" (400) and offered nothing.
func (h *Checkout) follow(orderID, key string, page url.Values) string {
	q := url.Values{"intent": {key}}
	for k, v := range page {
		q[k] = v
	}
	return h.svc.OrderPagePath(orderID, q)
}

// payError answers a Pay click the core did not carry out. page is the link the form came from
// (or nothing, a retry form: the order's page), which every answer leads back to: the POST's
// own URL has neither the link nor the page token, and an order page rendered from it would
// call a genuine link "incomplete or changed".
func (h *Checkout) payError(c echo.Context, orderID string, page url.Values, err error) error {
	switch code := payments.ErrorCode(err); {
	case code == payments.EBUSY:
		return c.Redirect(http.StatusSeeOther, h.follow(orderID, c.FormValue("intent"), page))
	case errors.Is(err, payments.ErrPaymentInReview):
		// The gateway took money for the order's last payment late (a stale "try again" form):
		// the page's state says so; nothing was started.
		return h.show(c, page, orderID, false, http.StatusConflict, "")
	case errors.Is(err, payments.ErrLinkReplaced):
		// The shop made a newer link for another amount since this form was rendered: nothing
		// is started, and the page says so (409).
		return h.refuse(c, orderID, err)
	case code == payments.EUNAVAIL, code == payments.ELOCKED, code == payments.EINTERNAL:
		// A lock timeout or an outage (503: the same click may be sent again), the order's
		// budget of new payments from the checkout spent (429, payments.CheckoutStartsPerHour),
		// or a fault: the error handler's customer page, with Retry-After and a way back to the
		// page the form came from (web/errors.go, orderPageBack).
		return err
	default:
		// A refusal (the order is paid meanwhile, an active payment of another amount, an
		// invalid contact or intent key): the order's page as the form's link shows it, with
		// what went wrong.
		status := http.StatusConflict
		if code == payments.EINVALID {
			status = http.StatusUnprocessableEntity
		}
		return h.show(c, page, orderID, false, status, payments.ErrorMessage(err))
	}
}

// closed answers a click whose form may no longer start a payment and that started none
// (payments.CheckoutRetry's and an expired link's refusals): the refusal page (410, or 409
// replaced), or, for an order no link ever priced, its page without a form and why.
//
// An order that moved on since the form was rendered — paid, or a payment started, in another
// tab — is shown as it is, with the refusal in the customer's words: "this link has expired,
// nothing was charged" alone would send a customer who paid back to the shop for a new link.
// So is one whose earlier payment the bank took late (in review, as payError shows it): the
// refusal page said "Nothing was charged" while the gateway held the customer's money (an
// outside review, checkout).
func (h *Checkout) closed(c echo.Context, orderID string, err error) error {
	if errors.Is(err, payments.ErrNoCheckoutRetry) {
		return h.show(c, url.Values{}, orderID, false, http.StatusConflict, payments.ErrorMessage(err))
	}
	order, _, gerr := h.svc.GetOrder(c.Request().Context(), orderID)
	switch {
	case gerr != nil && payments.ErrorCode(gerr) != payments.ENOTFOUND:
		return gerr
	case order.Status == payments.OrderPaid:
		return h.show(c, url.Values{}, orderID, false, http.StatusConflict,
			"This order is paid already: this form started nothing new.")
	case order.ActiveSessionID != "":
		return h.show(c, url.Values{}, orderID, false, http.StatusConflict,
			"A payment of this order is under way already (below): this form started nothing new.")
	}
	if gerr == nil {
		if inReview, rerr := h.svc.PaymentInReview(c.Request().Context(), orderID); rerr != nil {
			return rerr
		} else if inReview {
			return h.show(c, url.Values{}, orderID, false, http.StatusConflict, "")
		}
	}
	return h.refuse(c, orderID, err)
}

// formLink is the checkout link a Pay form carries (its amount, currency, exp, gen and sig) and
// its contact prefill, as the query of the link's page.
func formLink(c echo.Context) url.Values {
	q := linkForm(c)
	if v := c.FormValue("contact"); v != "" {
		q.Set("contact", v)
	}
	return q
}

// linkForm is the checkout link's parts a Pay form carries (payments.CheckoutLinkParams), as a
// query, each only when the form has it (a link without gen is one made before generations).
func linkForm(c echo.Context) url.Values {
	q := url.Values{}
	for _, k := range payments.CheckoutLinkParams {
		if v := c.FormValue(k); v != "" {
			q.Set(k, v)
		}
	}
	return q
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
