package handlers

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// NewPayment: GET /payments/new, the form to start a payment for a customer.
func (h *Console) NewPayment(c echo.Context) error {
	return render.HTML(c, http.StatusOK, views.NewPayment(views.NewPaymentView{
		Page: h.page(c, "Start a payment", "payments"), OrderID: c.QueryParam("order_id"), Currency: "EUR",
	}))
}

// CreatePayment: POST /payments. Create as the staff user (claim + register); the payment's
// page then has the gateway's payment link for the customer. The same order with the same
// amount while a session is active gives that session back (the core's rule), not a new one.
func (h *Console) CreatePayment(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	f := newPaymentForm{OrderID: c.FormValue("order_id"), Amount: c.FormValue("amount"),
		Currency: c.FormValue("currency"), Contact: c.FormValue("customer_contact")}
	in, err := f.input()
	var res payments.CreateResult
	if err == nil {
		res, err = h.svc.Create(c.Request().Context(), st.Actor(), in)
	}
	if err != nil {
		code := payments.ErrorCode(err)
		if code == payments.EINTERNAL {
			return err
		}
		if code != payments.EINVALID {
			h.audit(c, payments.AuditPaymentCreate, "order:"+in.OrderID, outcome(err))
		}
		return render.HTML(c, formStatus(code), views.NewPayment(views.NewPaymentView{
			Page: h.page(c, "Start a payment", "payments"), OrderID: f.OrderID, Amount: f.Amount, Currency: f.Currency,
			Contact: f.Contact, Field: errorField(err), Error: payments.ErrorMessage(err),
		}))
	}
	s := res.Session
	detail := fmt.Sprintf("order %s, %s, now %s", s.OrderID, views.Money(s.Amount, s.Currency), s.Status)
	msg := "Payment started: " + string(s.Status) + "."
	if page, perr := h.svc.PayableConfirmationURL(c.Request().Context(), s); perr == nil && page != "" {
		msg += " Send the customer the payment page link below." // none yet, or none while the order is in review
	}
	if !res.Created {
		detail = "existing active session returned: " + detail
		msg = "This order already has an active payment with the same amount; here it is."
	}
	h.audit(c, payments.AuditPaymentCreate, s.ID, detail)
	return h.done(c, "/payments/"+s.ID, msg, nil)
}
