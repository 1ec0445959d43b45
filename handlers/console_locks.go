package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/views"
	"pitlane/web/render"
)

// Locks: GET /locks, patrol leases and the advisory locks held or awaited right now. The live
// region's refresh (on session changes, and every few seconds while visible: pg_locks notifies
// nothing) gets only the live fragment.
func (h *Console) Locks(c echo.Context) error {
	ctx := c.Request().Context()
	v := views.LocksView{At: h.svc.Now()}
	var err error
	if v.Locks, err = h.svc.AdvisoryLocks(ctx); err != nil {
		return err
	}
	if v.Leases, err = h.svc.Leases(ctx); err != nil {
		return err
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Locks(v), views.LocksLive)
	}
	v.Page = h.page(c, "Leases and locks", "locks")
	return render.HTML(c, http.StatusOK, views.Locks(v))
}
