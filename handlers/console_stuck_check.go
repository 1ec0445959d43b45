package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
)

// CheckStuck: POST /finance/stuck/check with the ticked rows (id=…, repeated) or one row's
// button (one=…). payments.CheckNow claims the payments before asking the gateway, so a double
// click (two POSTs) asks once per payment; the second POST reports who is checking. Back to the
// same page of the workbench, with what happened as the flash.
func (h *Console) CheckStuck(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	back := "/finance/stuck" // never a redirect elsewhere: the workbench's own path and its query only
	if u, err := url.Parse(c.FormValue("back")); err == nil && u.Path == "/finance/stuck" && u.Host == "" && u.Scheme == "" {
		back = (&url.URL{Path: u.Path, RawQuery: u.Query().Encode()}).String()
	}
	form, err := c.FormParams()
	if err != nil {
		return err
	}
	ids := form["id"]
	if one := c.FormValue("one"); one != "" {
		ids = []string{one}
	}
	// With the gateway timing out, a page's checks take up to their claim's time, longer than
	// the server's WriteTimeout: the answer (a redirect with the summary) must still go out.
	if err := http.NewResponseController(c.Response()).SetWriteDeadline(time.Now().Add(h.svc.CheckNowClaimTTL() + 30*time.Second)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		h.log.Warn("check now: write deadline", "err", err)
	}
	res, err := h.svc.CheckNow(c.Request().Context(), st, ids)
	if err != nil {
		return h.done(c, back, "", err)
	}
	msg, failed := checkNowSummary(res)
	h.auth.Flash(c, !failed, msg)
	return h.done(c, back, "", nil)
}

// checkNowSummary says in one line what "Check now" did: every payment refused or skipped, by
// name and why, then the plain answers (the first ten). It listed the first ten rows in form
// order, so on a full page a refusal past the tenth was "and 2 more", counted as checked (an
// outside review of bulk actions). failed: some check was refused.
func checkNowSummary(res []payments.CheckNowResult) (string, bool) {
	var refused, skipped, answered []string
	for _, r := range res {
		id := views.Short(r.SessionID) + ": "
		switch {
		case r.Skipped != "":
			skipped = append(skipped, id+"skipped, "+r.Skipped)
		case r.Err != nil:
			refused = append(refused, id+payments.ErrorMessage(r.Err))
		default:
			answered = append(answered, id+string(r.Before)+" → "+string(r.After))
		}
	}
	parts := append(append(refused, skipped...), answered[:min(len(answered), 10)]...)
	if len(answered) > 10 {
		parts = append(parts, fmt.Sprintf("and %d more checked", len(answered)-10))
	}
	head := fmt.Sprintf("Checked %d, skipped %d.", len(answered), len(skipped))
	if len(refused) > 0 {
		head = fmt.Sprintf("Checked %d, failed %d, skipped %d.", len(answered), len(refused), len(skipped))
	}
	return head + " " + strings.Join(parts, "; ") + ".", len(refused) > 0
}
