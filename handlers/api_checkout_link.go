package handlers

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// checkoutLinkJSON is the answer of POST /api/v1/orders/{order_id}/checkout-links.
type checkoutLinkJSON struct {
	URL       string    `json:"url"`
	OrderID   string    `json:"order_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	ExpiresAt time.Time `json:"expires_at"`
}

// CreateCheckoutLink: POST /api/v1/orders/{order_id}/checkout-links
// {"amount","currency","expires_in"?}.
//
//	201 {"url","order_id","amount","currency","expires_at"}: url is the signed checkout page of
//	the order (PUBLIC_BASE_URL + /checkout/{order_id}?amount=…&currency=…&exp=…&gen=…&gsig=…&sig=…) to send
//	the customer to, working until expires_at (7 days, or expires_in seconds); 409 the order is
//	already paid, or has an active payment of another amount or currency; 422 a field, named.
//
// The link is a signature (payments/checkout_link.go): only the order's checkout price is
// written (checkout_prices, the newest link's amount, docs/api.md), so the call needs no
// idempotency key and may be repeated freely (each answer is a working link, the newest
// replacing the others' price).
func (a *API) CreateCheckoutLink(c echo.Context) error {
	req, err := parseCheckoutLink(c.Request(), PathParam(c, "order_id"))
	if err != nil {
		return err
	}
	in := req.Input
	link, err := a.svc.CheckoutLink(c.Request().Context(), in.OrderID, in.Amount, in.Currency, req.TTL)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusCreated, checkoutLinkJSON{URL: a.svc.CheckoutURL(link),
		OrderID: link.OrderID, Amount: link.Amount, Currency: link.Currency, ExpiresAt: link.ExpiresAt.UTC()})
}
