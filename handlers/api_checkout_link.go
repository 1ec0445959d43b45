package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// checkoutLinkJSON is the answer of POST /api/v1/orders/{order_id}/checkout-links.
type checkoutLinkJSON struct {
	URL      string `json:"url"`
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// CreateCheckoutLink: POST /api/v1/orders/{order_id}/checkout-links {"amount","currency"}.
//
//	201 {"url","order_id","amount","currency"}: url is the signed checkout page of the order
//	(PUBLIC_BASE_URL + /checkout/{order_id}?amount=…&currency=…&sig=…) to send the customer to;
//	409 the order is already paid; 422 a field, named.
//
// The link is a signature (payments/checkout_link.go), not a row: nothing is written, so the
// call needs no idempotency key and may be repeated freely (the same input gives the same url).
func (a *API) CreateCheckoutLink(c echo.Context) error {
	in, err := parseCheckoutLink(c.Request(), pathParam(c, "order_id"))
	if err != nil {
		return err
	}
	link, err := a.svc.CheckoutLink(c.Request().Context(), in.OrderID, in.Amount, in.Currency)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusCreated, checkoutLinkJSON{URL: a.svc.CheckoutURL(link),
		OrderID: link.OrderID, Amount: link.Amount, Currency: link.Currency})
}
