package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

type orderJSON struct {
	OrderID  string        `json:"order_id"`
	Status   string        `json:"status"`
	Payments []paymentJSON `json:"payments"`
}

// GetOrder: GET /api/v1/orders/{order_id} → 200 {"order_id","status","payments":[…]} (oldest
// payment first); 404 for an order pitlane has never seen.
func (a *API) GetOrder(c echo.Context) error {
	orderID := PathParam(c, "order_id")
	if !payments.ValidOrderID(orderID) {
		// Not an order id pitlane could have (and not one to send to the database as text:
		// invalid UTF-8 would be a database error, not a 404).
		return payments.Errorf(payments.ENOTFOUND, "order %q not found", orderID)
	}
	o, sessions, err := a.svc.GetOrder(c.Request().Context(), orderID)
	if err != nil {
		return err
	}
	out := orderJSON{OrderID: o.OrderID, Status: o.Status, Payments: make([]paymentJSON, 0, len(sessions))}
	for _, s := range sessions {
		p, err := a.paymentJSON(c.Request().Context(), s)
		if err != nil {
			return err
		}
		out.Payments = append(out.Payments, p)
	}
	return writeJSON(c, http.StatusOK, out)
}
