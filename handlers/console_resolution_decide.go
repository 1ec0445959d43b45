package handlers

import (
	"slices"
	"strconv"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// resolutionID reads the proposal id of the path; a malformed one is the same 404 as an unknown.
func resolutionID(c echo.Context) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil {
		return 0, notFound("proposal")
	}
	return id, nil
}

// ApproveResolution: POST /finance/resolutions/:id/approve. The second pair of eyes: the outcome
// is applied through the one transition function with the ledger rules (or the refund claimed
// through the refund core), audited, in one transaction (payments.ApproveResolution). The
// proposer is refused with a readable message.
func (h *Console) ApproveResolution(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	id, err := resolutionID(c)
	if err != nil {
		return err
	}
	r, err := h.svc.ApproveResolution(c.Request().Context(), st, id)
	msg := ""
	switch {
	case err == nil && r.Kind == payments.ProposalRefundSettle:
		msg = "Proposal " + r.Target() + " approved: refund " + views.Short(r.RefundID) + " of payment " + views.Short(r.SessionID) +
			" of order " + r.OrderID + " is " + r.RefundOutcome + "."
	case err == nil && r.IsRefund():
		msg = "Proposal " + r.Target() + " approved: " + r.What() + " of payment " + views.Short(r.SessionID) + " of order " + r.OrderID + " sent to the gateway."
	case err == nil:
		msg = "Proposal " + r.Target() + " approved: payment " + views.Short(r.SessionID) + " of order " + r.OrderID +
			" is " + string(r.SessionStatus) + "."
	}
	return h.done(c, "/finance/resolutions", msg, err)
}

// RejectResolution: POST /finance/resolutions/:id/reject with a note (required). Nothing
// changes but the proposal; audited in the same transaction.
func (h *Console) RejectResolution(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	id, err := resolutionID(c)
	if err != nil {
		return err
	}
	r, err := h.svc.RejectResolution(c.Request().Context(), st, id, c.FormValue("note"))
	if payments.ErrorCode(err) == payments.EINVALID {
		return h.rejectFormAgain(c, id, err)
	}
	msg := ""
	if err == nil {
		msg = "Proposal " + r.Target() + " rejected; payment " + views.Short(r.SessionID) + " is unchanged."
		if r.Kind == payments.ProposalRefundSettle {
			msg = "Proposal " + r.Target() + " rejected; refund " + views.Short(r.RefundID) + " is unchanged (still " + refundStill(r) + ")."
		}
	}
	return h.done(c, "/finance/resolutions", msg, err)
}

// rejectFormAgain answers a reject refused for its note (blank, not plain text) with the page as
// it is now (422), the refusal in the flash and the proposal's form holding the note as typed,
// tied to the refusal: redirected to the list, the note was lost, and with several proposals
// waiting nothing said whose it was (an outside review, a11y; as caseFormAgain). A proposal no
// longer waiting (decided meanwhile) has no form to hold a note: the list, as before.
func (h *Console) rejectFormAgain(c echo.Context, id int64, refusal error) error {
	v, err := h.resolutionsView(c.Request().Context())
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(v.Pending, func(r payments.Resolution) bool { return r.ID == id }) {
		return h.done(c, "/finance/resolutions", "", refusal)
	}
	h.auth.Flash(c, false, payments.ErrorMessage(refusal))
	v.Draft = &views.NoteDraft{ID: id, Note: c.FormValue("note"), Field: errorField(refusal)}
	v.Page = h.page(c, "Manual resolutions", "finance")
	return render.HTML(c, formStatus(payments.ErrorCode(refusal)), views.Resolutions(v))
}

// refundStill is how the refund of a rejected refund_settle proposal stays: Pending and flagged,
// or Failed by hand (a correction rejected).
func refundStill(r payments.Resolution) string {
	if r.RefundFrom == payments.RefundPending {
		return "Pending, flagged"
	}
	return r.RefundFrom
}
