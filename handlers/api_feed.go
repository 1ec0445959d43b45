package handlers

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// eventJSON is one status change in the events feed. Its id is the feed's cursor for it.
type eventJSON struct {
	ID         string       `json:"id"`
	Type       string       `json:"type"`
	PaymentID  string       `json:"payment_id"`
	OrderID    string       `json:"order_id"`
	Amount     int64        `json:"amount"`
	Currency   string       `json:"currency"`
	FromStatus *string      `json:"from_status"`
	Status     string       `json:"status"`
	By         string       `json:"by"`
	CreatedAt  time.Time    `json:"created_at"`
	Links      paymentLinks `json:"links"`
}

// eventTypePaymentStatus is the one kind of event the feed has today; readers skip types they
// do not know, so others can be added.
const eventTypePaymentStatus = "payment.status_changed"

type eventListJSON struct {
	Data       []eventJSON `json:"data"`
	NextCursor string      `json:"next_cursor"`
	HasMore    bool        `json:"has_more"`
}

// ListEvents: GET /api/v1/events?after=CURSOR&limit=N → 200 the status changes of every payment
// after the cursor (none: from the start), oldest first, at most limit (default
// payments.DefaultFeedRead, at most payments.MaxFeedRead). next_cursor is what to pass as after
// next time, also when nothing new came. A cursor is final: no change ever appears before one
// the feed has returned (payments/feed.go). A malformed after or limit → 422 naming it.
func (a *API) ListEvents(c echo.Context) error {
	limit := payments.DefaultFeedRead
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return payments.Invalid("limit", "limit must be a whole number between 1 and %d", payments.MaxFeedRead)
		}
		limit = n
	}
	page, err := a.svc.Feed(c.Request().Context(), c.QueryParam("after"), limit)
	if err != nil {
		return err
	}
	out := eventListJSON{Data: make([]eventJSON, len(page.Events)), NextCursor: page.Next, HasMore: page.More}
	for i, e := range page.Events {
		out.Data[i] = eventJSON{ID: e.Cursor, Type: eventTypePaymentStatus, PaymentID: e.SessionID, OrderID: e.OrderID,
			Amount: e.Amount, Currency: e.Currency, FromStatus: nullable(string(e.From)), Status: string(e.To),
			By: string(e.By), CreatedAt: e.At, Links: paymentLinks{Self: paymentLocation(e.SessionID)}}
	}
	return writeJSON(c, http.StatusOK, out)
}
