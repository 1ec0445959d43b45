package handlers

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Flagged: GET /finance/flagged?after=&refunds_after=, the sessions and refunds the patrol gave
// up on, each list a page at a time (its own cursor) with the count of all. An htmx request gets
// only the live lists.
func (h *Console) Flagged(c echo.Context) error {
	ctx := c.Request().Context()
	sessions, err := h.svc.ListFlagged(ctx, c.QueryParam("after"))
	if err != nil {
		return err
	}
	refunds, err := h.svc.ListFlaggedRefunds(ctx, c.QueryParam("refunds_after"))
	if err != nil {
		return err
	}
	v := views.FlaggedView{Sessions: sessions, Refunds: refunds, After: c.QueryParam("after"), RefundsAfter: c.QueryParam("refunds_after")}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Flagged(v), views.FlaggedLive)
	}
	v.Page = h.page(c, "Flagged payments and refunds", "finance")
	return render.HTML(c, http.StatusOK, views.Flagged(v))
}

// RetryFlagged: POST /finance/flagged/:id/retry. Clears the flag and makes the session due now (or once its last send can no longer be in flight)
// with a fresh patrol schedule; audited in the same transaction (payments.RetryFlagged).
func (h *Console) RetryFlagged(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	s, err := h.svc.RetryFlagged(c.Request().Context(), st, c.Param("id"))
	msg := ""
	if err == nil {
		msg = "Payment " + views.Short(s.ID) + " of order " + s.OrderID + " is back with the patrol."
	}
	return h.done(c, "/finance/flagged", msg, err)
}

// RetryFlaggedRefund: POST /finance/flagged/refunds/:id/retry. Clears a flagged refund's flag
// and makes it due now (or once its last send can no longer be in flight) with a fresh patrol schedule; audited in the same transaction
// (payments.RetryFlaggedRefund). Back to the flagged list, or with back=payment to the
// refund's payment page (its form there).
func (h *Console) RetryFlaggedRefund(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	r, err := h.svc.RetryFlaggedRefund(c.Request().Context(), st, c.Param("id"))
	msg := ""
	if err == nil {
		msg = "Refund " + views.Short(r.ID) + " of order " + r.OrderID + " is back with the patrol."
	}
	to := "/finance/flagged"
	if c.FormValue("back") == "payment" {
		if err != nil { // (r is empty): the refund as it is, for its payment
			r, _ = h.svc.GetRefund(c.Request().Context(), c.Param("id"))
		}
		if r.PaymentID != "" {
			to = string(views.PaymentURL(r.PaymentID))
		}
	}
	return h.done(c, to, msg, err)
}

// ProposeRefundOutcome: POST /finance/flagged/refunds/:id/propose (outcome, reason, evidence).
// Proposes how a flagged refund ended; a second finance or admin user approves it on the
// resolutions page (payments.ProposeRefundOutcome). A refusal shows the payment's page with the
// form again as it was sent (422 invalid, 409 conflict), or, when the refund is no longer one
// to propose for, goes back to that page with the reason.
func (h *Console) ProposeRefundOutcome(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	r, err := h.svc.ProposeRefundOutcome(ctx, st, payments.RefundOutcomeInput{RefundID: c.Param("id"),
		Outcome: c.FormValue("outcome"), Reason: c.FormValue("reason"), Evidence: c.FormValue("evidence")})
	if err == nil {
		return h.done(c, "/finance/resolutions#proposal-"+strconv.FormatInt(r.ID, 10),
			"Proposal "+r.Target()+": mark refund "+views.Short(r.RefundID)+" "+r.RefundOutcome+". A second finance or admin user must approve it.", nil)
	}
	code := payments.ErrorCode(err)
	if code == payments.EINTERNAL || code == payments.ENOTFOUND {
		return err
	}
	refund, gerr := h.svc.GetRefund(ctx, c.Param("id"))
	if gerr != nil {
		return gerr
	}
	d, gerr := h.svc.PaymentDetail(ctx, refund.PaymentID)
	if gerr != nil {
		return gerr
	}
	if !refund.SettleableByHand() || d.WaitingRefundSettle(refund.ID) != nil {
		// No form to fill in again (settled meanwhile, or another proposal waits): the page as
		// it is now says what happened, the flash why this was refused.
		return h.done(c, string(views.PaymentURL(refund.PaymentID)), "", err)
	}
	// The form again, open, with what was typed and why it was refused: a reason and evidence
	// that took minutes to write are not lost to a missing outcome or a race.
	v, gerr := h.paymentView(ctx, d)
	if gerr != nil {
		return gerr
	}
	h.auth.Flash(c, false, payments.ErrorMessage(err))
	v.RefundSettle = &views.RefundSettleDraft{RefundID: refund.ID, Outcome: c.FormValue("outcome"),
		Reason: c.FormValue("reason"), Evidence: c.FormValue("evidence"), Field: errorField(err)}
	v.Page = h.paymentPage(c, d)
	return render.HTML(c, formStatus(code), views.Payment(v))
}
