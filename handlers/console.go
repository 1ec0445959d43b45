package handlers

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/auth"
)

// Console serves the staff console: one file per page or action (console_*.go), form decoding
// in console_forms.go. Pages are server-rendered and work without JavaScript; their live
// parts update themselves (live.go: a stream says when, static/live.js fetches the part again)
// and htmx swaps the payment block after an action.
//
// Every action is audited: actions of the core (create, check, cancel) right after they return,
// with their outcome; the console's own (resolve a case, retry a flagged session) in the same
// transaction as the change.
type Console struct {
	svc       *payments.Service
	access    *access.Service
	auth      *auth.Manager
	log       *slog.Logger
	replicaID string
}

// NewConsole builds the console handlers over the core and access (both required: serve and dev
// always have them).
func NewConsole(svc *payments.Service, acc *access.Service, am *auth.Manager, replicaID string, log *slog.Logger) *Console {
	if log == nil {
		log = slog.Default()
	}
	return &Console{svc: svc, access: acc, auth: am, log: log, replicaID: replicaID}
}

// page is the layout's part of a full page, with the flash of the action that led here.
func (h *Console) page(c echo.Context, title, nav string) views.Page {
	ok, bad := h.auth.PopFlash(c)
	return views.Page{Title: title, Nav: nav, ReplicaID: h.replicaID, Flash: ok, FlashError: bad}
}

// htmx reports whether htmx asked (a poll or a swap) rather than a full page load.
func htmx(c echo.Context) bool {
	c.Response().Header().Add("Vary", "HX-Request")
	return c.Request().Header.Get("HX-Request") == "true"
}

// audit records a staff action; a failure to record is logged (the action already happened).
func (h *Console) audit(c echo.Context, action, target, detail string) {
	st := auth.Staff(c)
	if err := h.svc.RecordAudit(c.Request().Context(), payments.AuditEntry{
		Actor: st.Email, Role: string(st.Role), Action: action, Target: target, Detail: detail,
	}); err != nil {
		h.log.Error("audit", "action", action, "target", target, "err", err)
	}
}

// outcome is what an action's audit entry says about its error.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return payments.AuditOutcome(err)
}

// errorField is the form field a refusal names ("" when it names none, or is not the domain's).
func errorField(err error) string {
	if de := (*payments.Error)(nil); errors.As(err, &de) {
		return de.Field
	}
	return ""
}

// formStatus is the status of a form shown again with a refusal: 409 for a conflict, 503 while
// the database is unavailable (the same form may be sent again), 422 otherwise.
func formStatus(code string) int {
	switch code {
	case payments.ECONFLICT:
		return http.StatusConflict
	case payments.EUNAVAIL:
		return http.StatusServiceUnavailable
	}
	return http.StatusUnprocessableEntity
}

// done finishes an action the Post/Redirect/Get way: the outcome as a flash message on the
// page the browser is sent to (303). A refusal of the domain (conflict, wrong code, …) is
// shown there too; an internal error goes to the error page instead.
func (h *Console) done(c echo.Context, to, okMsg string, err error) error {
	if err != nil {
		if payments.ErrorCode(err) == payments.EINTERNAL || c.Request().Context().Err() != nil {
			return err // a fault, or a request cut at its bound (or its client gone): its own answer
		}
		h.auth.Flash(c, false, payments.ErrorMessage(err))
	} else if okMsg != "" {
		h.auth.Flash(c, true, okMsg)
	}
	return c.Redirect(http.StatusSeeOther, to)
}

// notFound turns a malformed path id into the same 404 as an unknown one.
func notFound(what string) error {
	return &payments.Error{Code: payments.ENOTFOUND, Message: what + " not found"}
}

var errNoStaff = errors.New("console: no staff user on the request (route without Require)")

// staff is the signed-in user of a request that passed Require.
func staff(c echo.Context) (payments.Staff, error) {
	st := auth.Staff(c)
	if st.Email == "" {
		return payments.Staff{}, errNoStaff
	}
	return st, nil
}
