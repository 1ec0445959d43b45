package handlers

import (
	"strconv"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
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
	msg := ""
	if err == nil {
		msg = "Proposal " + r.Target() + " rejected; payment " + views.Short(r.SessionID) + " is unchanged."
		if r.Kind == payments.ProposalRefundSettle {
			msg = "Proposal " + r.Target() + " rejected; refund " + views.Short(r.RefundID) + " is unchanged (still Pending, flagged)."
		}
	}
	return h.done(c, "/finance/resolutions", msg, err)
}
