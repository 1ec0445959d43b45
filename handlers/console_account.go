package handlers

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/auth"
	"pitlane/web/render"
)

// Account: GET /account, the signed-in user's own page (every role): who they are, and their
// password.
func (h *Console) Account(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	u, err := h.access.User(c.Request().Context(), st.Email)
	if err != nil {
		return err
	}
	return render.HTML(c, http.StatusOK, views.Account(views.AccountView{Page: h.page(c, "Your account", ""), User: u,
		Idle: h.auth.IdleTimeout()}))
}

// EndOtherSessions: POST /account/sessions, "sign out everywhere else": every session of the
// user ends (access.EndSessions), and this one starts again on a new token, with the deadline
// it had (auth.Restart).
func (h *Console) EndOtherSessions(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	u, err := h.access.EndSessions(c.Request().Context(), st, st.Email, h.auth.Epoch(c))
	if err == nil {
		err = h.auth.Restart(c, u)
	}
	return h.done(c, "/account", "You are signed out everywhere else.", err)
}

// ChangePassword: POST /account/password (current_password, password, password_repeat). The
// current password is proven like a sign-in (access.ChangeOwnPassword: throttle, lockout,
// audit). The new one ends every session of the user, this one too, which then starts again
// (a new token): the user stays signed in here and is signed out everywhere else.
func (h *Console) ChangePassword(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	if c.FormValue("password") != c.FormValue("password_repeat") {
		return h.done(c, "/account", "", &payments.Error{Code: payments.EINVALID, Field: "password_repeat",
			Message: "The new password and its repeat differ; nothing was changed."})
	}
	u, err := h.access.ChangeOwnPassword(c.Request().Context(), accessAttempt(c, st.Email, c.FormValue("current_password")), h.auth.Epoch(c), c.FormValue("password"))
	if err == nil {
		if err = h.auth.SignInAgain(c, u); errors.Is(err, auth.ErrSignedOut) {
			err = &payments.Error{Code: payments.ECONFLICT, Message: "Your password is changed, but you signed out while it was under way: sign in again with the new one."}
		}
	}
	return h.done(c, "/account", "Your password is changed. Your sessions elsewhere are signed out.", err)
}
