package handlers

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// ListEvents: GET /api/v1/events?after=CURSOR&limit=N → 200 the status changes of every payment
// after the cursor (none: from the start), oldest first, at most limit (default
// payments.DefaultFeedRead, at most payments.MaxFeedRead), as payments.FeedBody (the events
// webhook POSTs the same). next_cursor is what to pass as after next time, also when nothing new
// came. A cursor is final: no change ever appears before one the feed has returned
// (payments/feed.go). A malformed after or limit → 422 naming it.
func (a *API) ListEvents(c echo.Context) error {
	limit, err := feedLimit(c)
	if err != nil {
		return err
	}
	page, err := a.svc.Feed(c.Request().Context(), c.QueryParam("after"), limit)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, page.Body())
}

// ListPaymentEvents: GET /api/v1/payments/{id}/events?after=CURSOR&limit=N → 200 one payment's
// part of the feed (its status changes and its refunds'), with the same cursors, pages and
// body as ListEvents; an unknown payment → 404.
func (a *API) ListPaymentEvents(c echo.Context) error {
	limit, err := feedLimit(c)
	if err != nil {
		return err
	}
	page, err := a.svc.PaymentFeed(c.Request().Context(), PathParam(c, "id"), c.QueryParam("after"), limit)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, page.Body())
}

// feedLimit is a feed read's limit query parameter (payments.DefaultFeedRead when absent).
func feedLimit(c echo.Context) (int, error) {
	v := c.QueryParam("limit")
	if v == "" {
		return payments.DefaultFeedRead, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, payments.Invalid("limit", "limit must be a whole number between 1 and %d", payments.MaxFeedRead)
	}
	return n, nil
}
