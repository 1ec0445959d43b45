package handlers

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/access"
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
// the throttle (per account, per client address, overall: access.Limits) answers 429 with
// Retry-After (when the refusal lapses), except for a browser that signed in to the account
// before (its device cookie: access/devices.go). Success renews the session token, keeps the
// device cookie and goes to the page the user wanted. access.SignIn audits.
func (h *Console) Login(c echo.Context) error {
	email := access.NormalizeEmail(c.FormValue("email"))
	next := auth.LocalPath(c.FormValue("next"))
	a := accessAttempt(c, email, c.FormValue("password"))
	a.Device = h.auth.DeviceToken(c)
	u, err := h.access.SignIn(c.Request().Context(), a)
	if err != nil {
		code := payments.ErrorCode(err)
		if code == payments.EINTERNAL || code == payments.EUNAVAIL {
			return err
		}
		status := http.StatusUnprocessableEntity
		if code == payments.ELOCKED {
			status = http.StatusTooManyRequests
			if d := payments.RetryAfter(err); d > 0 { // whole seconds, rounded up
				c.Response().Header().Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
			}
		}
		if len(email) > 254 {
			email = email[:254]
		}
		return render.HTML(c, status, views.Login(views.LoginView{
			Page: h.page(c, "Sign in", ""), Email: email, Next: next, Error: payments.ErrorMessage(err),
		}))
	}
	if err := h.auth.SignIn(c, u); err != nil {
		return err
	}
	// This browser may sign in to this account from now on whatever the throttle's address
	// and global buckets say (access/devices.go).
	device, err := h.access.RememberDevice(c.Request().Context(), u, a.Device)
	if err != nil {
		return err
	}
	if device != "" { // "": the account changed since the sign-in read it (its session is over too)
		h.auth.SetDeviceToken(c, device, access.DeviceTTL)
	}
	return c.Redirect(http.StatusSeeOther, next)
}

// accessAttempt is a sign-in attempt of the request's client (its address as the router
// determined it: X-Forwarded-For only from TRUSTED_PROXIES).
func accessAttempt(c echo.Context, email, password string) access.Attempt {
	return access.Attempt{Email: email, Password: password, Address: c.RealIP(), UserAgent: c.Request().UserAgent()}
}

// Logout: POST /logout. The session ends first and the audit entry follows it: a sign-out cut
// before its session's row was deleted left the session working under an audited "logout" (the
// entry outlives its request; an outside review).
func (h *Console) Logout(c echo.Context) error {
	if email := h.auth.SignedIn(c); email != "" {
		if err := h.auth.SignOut(c); err != nil {
			return err
		}
		if err := h.access.RecordAudit(c.Request().Context(), payments.AuditEntry{
			Actor: email, Action: payments.AuditLogout, Target: email,
		}); err != nil {
			h.log.Error("audit", "action", payments.AuditLogout, "err", err)
		}
	}
	return c.Redirect(http.StatusSeeOther, "/login")
}
