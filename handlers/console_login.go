package handlers

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/auth"
	"pitlane/web/render"
)

// LoginPage: GET /login, the staff sign-in form.
func (h *Console) LoginPage(c echo.Context) error {
	if h.auth.SignedIn(c) != "" {
		return c.Redirect(http.StatusSeeOther, auth.LocalPath(c.QueryParam("next")))
	}
	return render.HTML(c, http.StatusOK, views.Login(views.LoginView{
		Page: h.page(c, "Sign in", ""),
		Next: auth.LocalPath(c.QueryParam("next")),
	}))
}

// Login: POST /login. A wrong password, an unknown email and a disabled user look the same;
// five failures in a row lock the email for 15 minutes (payments.AuthenticateStaff). Success
// renews the session token and goes to the page the user wanted.
func (h *Console) Login(c echo.Context) error {
	if err := h.ready(); err != nil {
		return err
	}
	email := payments.NormalizeEmail(c.FormValue("email"))
	next := auth.LocalPath(c.FormValue("next"))
	u, err := h.svc.AuthenticateStaff(c.Request().Context(), email, c.FormValue("password"))
	if err != nil {
		code := payments.ErrorCode(err)
		if code == payments.EINTERNAL || code == payments.EUNAVAIL {
			return err
		}
		if len(email) > 254 {
			email = email[:254]
		}
		if aerr := h.svc.RecordAudit(c.Request().Context(), payments.AuditEntry{
			Actor: email, Action: payments.AuditLoginFailed, Target: email, Detail: code,
		}); aerr != nil {
			h.log.Error("audit", "action", payments.AuditLoginFailed, "err", aerr)
		}
		status := http.StatusUnprocessableEntity
		if code == payments.ELOCKED {
			status = http.StatusTooManyRequests
		}
		return render.HTML(c, status, views.Login(views.LoginView{
			Page: h.page(c, "Sign in", ""), Email: email, Next: next, Error: payments.ErrorMessage(err),
		}))
	}
	if err := h.auth.SignIn(c, u); err != nil {
		return err
	}
	if err := h.svc.RecordAudit(c.Request().Context(), payments.AuditEntry{
		Actor: u.Email, Role: string(u.Role), Action: payments.AuditLogin, Target: u.Email,
		Detail: "from " + c.RealIP() + " " + strings.TrimSpace(c.Request().UserAgent()),
	}); err != nil {
		h.log.Error("audit", "action", payments.AuditLogin, "err", err)
	}
	return c.Redirect(http.StatusSeeOther, next)
}

// Logout: POST /logout.
func (h *Console) Logout(c echo.Context) error {
	if err := h.ready(); err != nil {
		return err
	}
	if email := h.auth.SignedIn(c); email != "" {
		if err := h.svc.RecordAudit(c.Request().Context(), payments.AuditEntry{
			Actor: email, Action: payments.AuditLogout, Target: email,
		}); err != nil {
			h.log.Error("audit", "action", payments.AuditLogout, "err", err)
		}
		if err := h.auth.SignOut(c); err != nil {
			return err
		}
	}
	return c.Redirect(http.StatusSeeOther, "/login")
}
