package handlers

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/auth"
	"pitlane/web/render"
)

// Users: GET /admin/users, the staff list with what an admin may change: disable a user, give
// another role, set a new password, enable a disabled one (the same as `pitlane user
// disable|enable|role|password`).
func (h *Console) Users(c echo.Context) error {
	users, err := h.access.ListUsers(c.Request().Context())
	if err != nil {
		return err
	}
	return render.HTML(c, http.StatusOK, views.Users(views.UsersView{Page: h.page(c, "Users", "users"), Users: users,
		Me: auth.Staff(c).Email}))
}

// DisableUser: POST /admin/users/{id}/disable. The user's sessions end at their next request.
func (h *Console) DisableUser(c echo.Context) error {
	return h.changeUser(c, func(u access.User) (string, error) {
		_, err := h.access.DisableUser(c.Request().Context(), auth.Staff(c), u.Email)
		return fmt.Sprintf("%s is disabled; their sessions end at their next request.", u.Email), err
	})
}

// EnableUser: POST /admin/users/{id}/enable, undoing a disable. The user signs in again with the
// password they had; their sessions from before the disable stay ended.
func (h *Console) EnableUser(c echo.Context) error {
	return h.changeUser(c, func(u access.User) (string, error) {
		_, err := h.access.EnableUser(c.Request().Context(), auth.Staff(c), u.Email)
		return fmt.Sprintf("%s is enabled; they sign in with their password.", u.Email), err
	})
}

// SetUserRole: POST /admin/users/{id}/role with role.
func (h *Console) SetUserRole(c echo.Context) error {
	return h.changeUser(c, func(u access.User) (string, error) {
		role := access.Role(c.FormValue("role"))
		_, err := h.access.SetRole(c.Request().Context(), auth.Staff(c), u.Email, role)
		return fmt.Sprintf("%s is now %s.", u.Email, role), err
	})
}

// SetUserPassword: POST /admin/users/{id}/password with password. The user's sessions end (a
// new password throws out whoever knew the old one) and a sign-in lockout of theirs is lifted.
// Not the admin's own: that is /account's, which asks for the current password first, so a
// session someone else got hold of cannot lock its owner out (an outside review).
func (h *Console) SetUserPassword(c echo.Context) error {
	return h.changeUser(c, func(u access.User) (string, error) {
		if u.Email == auth.Staff(c).Email { // both as stored: a look-alike's row is not one's own
			return "", payments.Errorf(payments.EFORBIDDEN, "change your own password on your account page: it asks for the current one")
		}
		_, err := h.access.SetPassword(c.Request().Context(), auth.Staff(c), u.Email, c.FormValue("password"))
		return fmt.Sprintf("%s has a new password; their sessions are ended.", u.Email), err
	})
}

// changeUser finds the path's user and applies change the Post/Redirect/Get way: the outcome,
// or the refusal (the last admin, a short password, …), is a flash on the users page. access
// writes the audit entry with the change.
func (h *Console) changeUser(c echo.Context, change func(access.User) (string, error)) error {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil {
		return notFound("user")
	}
	u, err := h.access.UserByID(c.Request().Context(), id)
	if err != nil {
		return err
	}
	msg, err := change(u)
	if code := payments.ErrorCode(err); (code == payments.EINVALID || code == payments.ECONFLICT) && !strings.Contains(payments.ErrorMessage(err), u.Email) {
		// The page has a form per user: a refusal of the change says whose ("the password must
		// be at least 12 characters" alone did not, an outside review, a11y). Not one about the
		// admin themself (their session ended, their role changed): that is not the user's.
		err = &payments.Error{Code: payments.ErrorCode(err), Message: u.Email + ": " + payments.ErrorMessage(err), Err: err}
	}
	return h.done(c, "/admin/users", msg, err)
}
