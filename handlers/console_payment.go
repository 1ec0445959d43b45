package handlers

import (
	"context"
	"net/http"
	"net/url"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Payment: GET /payments/:id[?challenge=…], one payment with everything known about it; with
// a challenge, the form to enter the customer's code (of a cancel or of a refund). A live refresh
// (static/live.js) gets the payment block alone, without the layout (and without taking the flash
// meant for the page an action redirects to).
func (h *Console) Payment(c echo.Context) error {
	d, err := h.svc.PaymentDetail(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	v, err := h.paymentView(c.Request().Context(), d)
	if err != nil {
		return err
	}
	if id := c.QueryParam("challenge"); id != "" {
		if ch, ok := d.Challenge(id); ok {
			v.Challenge = &ch
		}
	}
	if liveRefresh(c) {
		return render.Fragments(c, http.StatusOK, views.Payment(v), views.PageContent)
	}
	if htmx(c) {
		// An action's form (views.actionForm) swapped this page in after its redirect: the
		// address bar takes the page's URL (with ?challenge= when a code form is open), so a
		// live refresh (static/live.js fetches location) keeps showing what the action opened.
		c.Response().Header().Set("HX-Replace-Url", c.Request().URL.RequestURI())
	}
	v.Page = h.paymentPage(c, d)
	// A code form shown again after its code was refused (codeRefused): the flash is about its
	// field. Only with the flash: a reload of the same address is a plain form.
	v.CodeRefused = c.QueryParam("refused") == "code" && v.Challenge != nil && v.Page.FlashError != ""
	return render.HTML(c, http.StatusOK, views.Payment(v))
}

// codeRefused is the address of payment id's page with the code form of challenge open again
// after its confirmation was refused (err): a wrong code ties the code field to the flash saying
// why (an outside review, a11y: the field the keyboard lands on said only "Code, edit text");
// another refusal (no room left, the database away) is not the field's.
func codeRefused(id, challenge string, err error) string {
	to := "/payments/" + id + "?challenge=" + url.QueryEscape(challenge)
	if payments.ErrorCode(err) == payments.EWRONG {
		to += "&refused=code"
	}
	return to
}

// paymentView is a payment's page with fresh intent keys for its refund form (every submission
// of that form is one refund) and its "Request cancel" form (one code however often it is sent).
func (h *Console) paymentView(ctx context.Context, d payments.PaymentDetail) (views.PaymentView, error) {
	payURL, err := h.svc.PayableConfirmationURL(ctx, d.Session)
	return views.PaymentView{D: d, RefundIntent: uuid.NewString(), CancelIntent: uuid.NewString(), DirectLimit: h.svc.RefundDirectLimit(d.Session.Currency),
		PayURL: payURL}, err
}

// paymentPage is the layout's part of a payment's page (title, navigation, flashes).
func (h *Console) paymentPage(c echo.Context, d payments.PaymentDetail) views.Page {
	return h.page(c, "Payment "+views.Short(d.Session.ID), "payments")
}
