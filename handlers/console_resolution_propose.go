package handlers

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// NewResolution: GET /finance/resolutions/new?session=…, the payment and, when it may be
// settled by hand, the form to propose its outcome.
func (h *Console) NewResolution(c echo.Context) error {
	cand, err := h.svc.SettleCandidate(c.Request().Context(), c.QueryParam("session"))
	if err != nil {
		return err
	}
	return render.HTML(c, http.StatusOK, views.ProposeResolution(views.ProposeView{Page: h.page(c, "Settle by hand", "finance"), C: cand}))
}

// ProposeResolution: POST /finance/resolutions (session, outcome, reason, evidence). The first
// pair of eyes: the proposal and its audit entry are one transaction (payments.ProposeResolution).
// A refusal shows the form again with the reason, what was typed, and the payment as it is now
// (a form whose payment moved since it was read, seen, is refused: its evidence was written for
// another state); success goes to the list, where a second finance or admin user approves.
func (h *Console) ProposeResolution(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	in := payments.ProposalInput{SessionID: c.FormValue("session"), Outcome: payments.Status(c.FormValue("outcome")),
		Reason: c.FormValue("reason"), Evidence: c.FormValue("evidence"), Seen: payments.Status(c.FormValue("seen")),
		CasesSeen: c.FormValue("cases_seen")}
	if in.CasesSeen == "" {
		// A form without the field (the previous release's, or one it was removed from) showed
		// none of the gateway's cases: news it never showed is refused, not recorded as seen.
		in.CasesSeen = payments.CasesSeenNone
	}
	r, err := h.svc.ProposeResolution(c.Request().Context(), st, in)
	if err == nil {
		msg := "Proposal " + r.Target() + ": mark " + views.Short(r.SessionID) + " " + string(r.Outcome) +
			". A second finance or admin user must approve it."
		return h.done(c, "/finance/resolutions#proposal-"+strconv.FormatInt(r.ID, 10), msg, nil)
	}
	code := payments.ErrorCode(err)
	if code == payments.EINTERNAL || code == payments.ENOTFOUND {
		return err
	}
	cand, cerr := h.svc.SettleCandidate(c.Request().Context(), in.SessionID)
	if cerr != nil {
		return cerr
	}
	outcome := string(in.Outcome)
	if errorField(err) == "seen" {
		outcome = "" // chosen for the state the form showed: chosen again for the one it shows now
	}
	return render.HTML(c, formStatus(code), views.ProposeResolution(views.ProposeView{Page: h.page(c, "Settle by hand", "finance"), C: cand,
		Outcome: outcome, Reason: in.Reason, Evidence: in.Evidence, Field: errorField(err), Error: payments.ErrorMessage(err)}))
}
