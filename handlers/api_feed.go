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
	return writeJSON(c, http.StatusOK, page.Body())
}
