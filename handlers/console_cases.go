package handlers

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/views"
	"pitlane/web/render"
)

// Finance: GET /finance, the finance area starts at its workbench (stuck money).
func (h *Console) Finance(c echo.Context) error {
	return c.Redirect(http.StatusSeeOther, "/finance/stuck")
}

// Cases: GET /finance/cases[?all=1]. An htmx request gets only the live list.
func (h *Console) Cases(c echo.Context) error {
	v := views.CasesView{All: c.QueryParam("all") != ""}
	if a := c.QueryParam("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n <= 0 {
			return payments.Invalid("after", "after must be a case number")
		}
		v.After = n
	}
	var err error
	if v.CasePage, err = h.svc.ListCases(c.Request().Context(), v.All, v.After); err != nil {
		return err
	}
	if htmx(c) {
		return render.Fragments(c, http.StatusOK, views.Cases(v), views.CasesLive)
	}
	v.Page = h.page(c, "Finance cases", "finance")
	return render.HTML(c, http.StatusOK, views.Cases(v))
}

// ResolveCase: POST /finance/cases/:id/resolve with a note (required). The resolution and its
// audit entry are one transaction (payments.ResolveCase).
func (h *Console) ResolveCase(c echo.Context) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	id, perr := strconv.ParseInt(c.Param("id"), 10, 64)
	if perr != nil {
		return notFound("case")
	}
	fc, err := h.svc.ResolveCase(c.Request().Context(), st, id, c.FormValue("note"), c.FormValue("seen"))
	if code := payments.ErrorCode(err); code == payments.ECONFLICT || code == payments.EINVALID {
		return h.caseFormAgain(c, id, err)
	}
	msg := ""
	if err == nil {
		msg = "Case " + strconv.FormatInt(fc.ID, 10) + " (" + fc.Kind + ") resolved."
	}
	return h.done(c, "/finance/cases", msg, err)
}

// caseFormAgain answers a resolve form refused — the case changed since it was read (news added
// to it), or a blank note — with the open cases from that case on, as they are now (409, 422),
// the refusal in the flash and the case's form holding the note as typed, under the case's new
// text: redirected to the list, the note was lost, and finance typed it again (an outside review,
// a11y). From the case on: a case past the first page was not on it (a review of this change).
// A case no longer open (resolved meanwhile) has no form to hold a note: the list, as before.
func (h *Console) caseFormAgain(c echo.Context, id int64, refusal error) error {
	v := views.CasesView{After: id - 1, Draft: &views.NoteDraft{ID: id, Note: c.FormValue("note"), Field: errorField(refusal)}}
	var err error
	if v.CasePage, err = h.svc.ListCases(c.Request().Context(), false, v.After); err != nil {
		return err
	}
	if len(v.Cases) == 0 || v.Cases[0].ID != id {
		return h.done(c, "/finance/cases", "", refusal)
	}
	h.auth.Flash(c, false, payments.ErrorMessage(refusal))
	v.Page = h.page(c, "Finance cases", "finance")
	return render.HTML(c, formStatus(payments.ErrorCode(refusal)), views.Cases(v))
}
