package handlers

import (
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// RequestCancel: POST /payments/:id/cancel. A one-time code goes to the customer (outbox /
// NOTIFY_WEBHOOK_URL; staff never see it); the payment's page then opens the form to enter the
// code the customer reads out. The form's intent key makes a double click one code.
func (h *Console) RequestCancel(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	id := c.Param("id")
	ch, err := h.svc.RequestCancelOnce(c.Request().Context(), st.Actor(), id, c.FormValue("intent"))
	detail, msg := outcome(err), "A one-time code went to the customer. Ask them to read it to you."
	switch {
	case err == nil && ch.Reused:
		detail = "the form's code is still open, challenge " + ch.ID + ": nothing sent"
		msg = "The code this form asked for is still open (nothing new was sent). Ask the customer to read it to you."
	case err == nil:
		detail = "code sent, challenge " + ch.ID + ", expires " + ch.ExpiresAt.UTC().Format("15:04:05") + " UTC"
	}
	if err == nil {
		detail, msg = notYetSent(ch, detail, msg)
	}
	h.audit(c, payments.AuditCancelRequest, id, detail)
	to := "/payments/" + id
	if err == nil {
		to += "?challenge=" + url.QueryEscape(ch.ID)
	}
	return h.done(c, to, msg, err)
}

// ConfirmCancel: POST /payments/:id/cancel/:challenge with the code. Consumes the code and
// cancels (payments.ConfirmCancel: one reverse at the gateway, however often this is sent).
func (h *Console) ConfirmCancel(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	id, challenge := c.Param("id"), c.Param("challenge")
	res, err := h.svc.ConfirmCancel(c.Request().Context(), st.Actor(), id, challenge, strings.TrimSpace(c.FormValue("code")))
	detail := outcome(err)
	msg := ""
	if err == nil {
		detail = "challenge " + challenge + ": now " + string(res.Session.Status)
		msg = "Cancel confirmed: the payment is " + string(res.Session.Status) + "."
		if res.Replayed {
			detail += " (code already used; nothing new done)"
			msg = "This code was already used; the payment is " + string(res.Session.Status) + "."
		}
	}
	if err != nil && res.Session.ID != "" {
		// The core committed the cancel (and audited it), then its reverse found the payment
		// finished at the gateway: this entry says what became of that cancel, not a refusal
		// of the code.
		detail = "challenge " + challenge + ": the confirmed cancel lost its race at the gateway; now " +
			string(res.Session.Status) + ": " + payments.ErrorMessage(err)
	}
	if err != nil || res.Replayed {
		h.audit(c, payments.AuditCancelConfirm, id, detail) // a cancel it started, the core audited with it
	}
	to := "/payments/" + id
	if err != nil && payments.ErrorCode(err) != payments.ECONFLICT {
		// The code form again, with the refusal; a payment that cannot be canceled (any more)
		// gets its page with the reason instead.
		to = codeRefused(id, challenge, err)
	}
	return h.done(c, to, msg, err)
}

// notYetSent is a new code's audit detail and page message when its message did not reach the
// notifier (payments.Challenge.Undelivered): the page said the code went to the customer while
// the notifier had refused it, and support waited for a code that was not on its way yet (an
// outside review, outbox). The patrol sends it again within minutes.
func notYetSent(ch payments.Challenge, detail, msg string) (string, string) {
	if ch.Undelivered == "" {
		return detail, msg
	}
	return detail + "; not delivered yet: " + ch.Undelivered,
		"The one-time code could not be sent to the customer yet (" + ch.Undelivered + "); it is sent again within a few minutes. Ask them to read it to you once it arrives."
}
