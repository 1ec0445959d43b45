package handlers

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Refunds from the payment page (payments/staff_refund.go). Each form carries an intent key
// rendered with the page, so submitting one form twice makes one code, refund or proposal, and
// what counted against the refundable amount on that page (seen), so a form the payment's refunds
// outran is refused and comes back with what was typed (refundFormAgain).
// A refund claimed or a proposal made is audited by the core, in the transaction that does it;
// the console audits the rest right after the core returns, with the outcome (a code sent, a
// refusal, a form sent again).

// readRefundForm reads a refund form posted for the payment of the path.
func (h *Console) readRefundForm(c echo.Context) (payments.Session, payments.StaffRefundInput, error) {
	sess, err := h.svc.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return sess, payments.StaffRefundInput{}, err
	}
	in, err := refundForm{Amount: c.FormValue("amount"), Reason: c.FormValue("reason"), Intent: c.FormValue("intent"),
		Seen: c.FormValue("seen")}.input(sess)
	return sess, in, err
}

// refundText says what happened to a refund, for people.
func refundText(r payments.Refund) string {
	switch r.Status {
	case payments.RefundSucceeded:
		return "Refunded " + views.Money(r.Amount, r.Currency) + "."
	case payments.RefundFailed:
		return "The refund of " + views.Money(r.Amount, r.Currency) + " failed: " + r.Detail + "."
	}
	return "Refund of " + views.Money(r.Amount, r.Currency) + " sent; the gateway has not confirmed it yet (it is asked again until it does)."
}

// RequestRefundCode: POST /payments/:id/refunds/code (support). A one-time code naming the
// amount goes to the customer; the page then opens the form to enter it.
func (h *Console) RequestRefundCode(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	sess, in, err := h.readRefundForm(c)
	if err != nil && payments.ErrorCode(err) == payments.ENOTFOUND {
		return err
	}
	var ch payments.Challenge
	if err == nil {
		ch, err = h.svc.RequestRefundCode(c.Request().Context(), st, in)
	}
	detail, msg := outcome(err), "A one-time code for the refund went to the customer. Ask them to read it to you."
	to := "/payments/" + sess.ID
	switch {
	case err == nil && ch.Reused:
		detail = fmt.Sprintf("%s: the form's code is still open, challenge %s: nothing sent", views.Money(in.Amount, sess.Currency), ch.ID)
		msg = "The code this form asked for is still open (nothing new was sent). Ask the customer to read it to you."
	case err == nil:
		detail = fmt.Sprintf("%s: code sent, challenge %s, expires %s UTC: %s", views.Money(in.Amount, sess.Currency), ch.ID,
			ch.ExpiresAt.UTC().Format("15:04:05"), strings.TrimSpace(in.Reason))
	}
	if err == nil {
		detail, msg = notYetSent(ch, detail, msg)
	}
	if err == nil {
		to += "?challenge=" + url.QueryEscape(ch.ID)
	}
	h.audit(c, payments.AuditRefundRequest, sess.ID, detail)
	if errorField(err) == "seen" {
		return h.refundFormAgain(c, sess.ID, err)
	}
	return h.done(c, to, msg, err)
}

// refundFormAgain answers a refund form refused because the payment's refunds changed since its
// page was read (the core's field "seen"): the payment's page as it is now (409), the refusal in
// the flash, and the form open with the amount and reason that were typed, so the person reads
// what changed and sends them again from a page that shows it, or does not. Typing the reason is
// how the form went stale (live.js does not refresh a region someone types in); losing it to the
// refusal would have the person type it again on top of a page they may not read first.
func (h *Console) refundFormAgain(c echo.Context, id string, refusal error) error {
	ctx := c.Request().Context()
	d, err := h.svc.PaymentDetail(ctx, id)
	if err != nil {
		return err
	}
	v, err := h.paymentView(ctx, d)
	if err != nil {
		return err
	}
	h.auth.Flash(c, false, payments.ErrorMessage(refusal))
	v.RefundDraft = &views.RefundDraft{Amount: c.FormValue("amount"), Reason: c.FormValue("reason"), Field: errorField(refusal)}
	v.Page = h.paymentPage(c, d)
	return render.HTML(c, formStatus(payments.ErrorCode(refusal)), views.Payment(v))
}

// ConfirmRefund: POST /payments/:id/refunds/code/:challenge with the code the customer reads
// out (support). Spends the code and refunds (one refund however often this is sent).
func (h *Console) ConfirmRefund(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	id, challenge := c.Param("id"), c.Param("challenge")
	res, err := h.svc.ConfirmRefund(c.Request().Context(), st, id, challenge, strings.TrimSpace(c.FormValue("code")))
	detail, msg := outcome(err), ""
	if err == nil {
		r := res.Refund
		detail = fmt.Sprintf("challenge %s: refund %s of %s, %s", challenge, r.ID, views.Money(r.Amount, r.Currency), r.Status)
		msg = refundText(r)
		if !res.Created {
			detail += " (code already used; nothing new done)"
			msg = "This code was already used. " + msg
		}
	}
	if err != nil || !res.Created {
		h.audit(c, payments.AuditRefundConfirm, id, detail) // a refund it claimed, the core audited with it
	}
	to := "/payments/" + id
	if err != nil {
		to = codeRefused(id, challenge, err) // the code form again, with the refusal
	}
	return h.done(c, to, msg, err)
}

// RefundPayment: POST /payments/:id/refunds (finance). Within REFUND_DIRECT_LIMIT the refund
// happens now; above it a four-eyes proposal waits for a second finance or admin user.
func (h *Console) RefundPayment(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	sess, in, err := h.readRefundForm(c)
	if err != nil && payments.ErrorCode(err) == payments.ENOTFOUND {
		return err
	}
	var res payments.FinanceRefund
	if err == nil {
		res, err = h.svc.RefundByFinance(c.Request().Context(), st, in)
	}
	msg := ""
	switch {
	case err != nil:
		h.audit(c, payments.AuditRefund, sess.ID, outcome(err))
	case res.Proposal != nil:
		p := res.Proposal
		msg = fmt.Sprintf("%s is more than you may refund alone: proposal %s waits for a second finance or admin user.", views.Money(p.RefundAmount, p.Currency), p.Target())
		if res.Replayed {
			msg = fmt.Sprintf("This form was sent already: proposal %s (%s).", p.Target(), p.State)
		}
	default:
		// A refund the form claimed now, the core audited in the claim's transaction.
		r := *res.Refund
		msg = refundText(r)
		if res.Replayed {
			msg = "This form was sent already. " + msg
			h.audit(c, payments.AuditRefund, sess.ID, fmt.Sprintf("refund %s of %s, %s: %s (form sent again; nothing new done)",
				r.ID, views.Money(r.Amount, r.Currency), r.Status, strings.TrimSpace(in.Reason)))
		}
	}
	if errorField(err) == "seen" {
		return h.refundFormAgain(c, sess.ID, err)
	}
	return h.done(c, "/payments/"+sess.ID, msg, err)
}
