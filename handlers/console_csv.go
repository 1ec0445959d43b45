package handlers

import (
	"encoding/csv"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// csvFlushEvery is how many CSV rows go out per flush: the browser sees the download start at
// once and the server holds no more than this many rows in its buffer.
const csvFlushEvery = 500

// csvWriteWait is how long reading the next csvFlushEvery rows and writing them may take. Each
// flush moves the deadline on, so the server's WriteTimeout (a minute by default) does not cut
// an export of the whole ledger that takes longer.
const csvWriteWait = time.Minute

// streamCSV sends a CSV download named pitlane-<name>-<time>.csv: the header, then each row
// export writes, flushed every csvFlushEvery rows. The export is audited (action, target, the
// row count and the filter). A failure once the status is sent aborts the response, so the
// download fails visibly instead of ending as if the file were whole.
func (h *Console) streamCSV(c echo.Context, name, action, target, filter string, header []string,
	export func(write func([]string) error) (int, error)) error {
	st, err := staff(c)
	if err != nil {
		return err
	}
	w := c.Response()
	rc := http.NewResponseController(w)
	extend := func() {
		if err := rc.SetWriteDeadline(time.Now().Add(csvWriteWait)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			h.log.Warn(name+" export: write deadline", "err", err)
		}
	}
	extend()
	w.Header().Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	w.Header().Set(echo.HeaderContentDisposition, `attachment; filename="pitlane-`+name+`-`+h.svc.Now().UTC().Format("20060102-150405")+`.csv"`)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	cw := csv.NewWriter(w)
	_ = cw.Write(header)
	rows := 0
	n, err := export(func(rec []string) error {
		if err := cw.Write(rec); err != nil {
			return err
		}
		if rows++; rows%csvFlushEvery == 0 {
			cw.Flush()
			w.Flush()
			extend()
		}
		return cw.Error()
	})
	cw.Flush()
	if err == nil {
		err = cw.Error()
	}
	detail := "rows " + strconv.Itoa(n) + ", filter " + filter
	if err != nil {
		detail += ", aborted: " + err.Error()
	}
	if aerr := h.svc.RecordAudit(c.Request().Context(), payments.AuditEntry{Actor: st.Email, Role: string(st.Role),
		Action: action, Target: target, Detail: detail}); aerr != nil {
		h.log.Error("audit", "action", action, "err", aerr)
	}
	if err != nil {
		h.log.Error(name+" export aborted", "rows", n, "err", err)
		panic(http.ErrAbortHandler) // the status is sent: only a broken transfer says "incomplete"
	}
	w.Flush()
	return nil
}

// csvText keeps a text cell from being read as a formula by a spreadsheet (=, +, -, @, a tab or
// a carriage return first, spaces before them too; also their full-width forms, which some
// locales' spreadsheets read as the same signs). Each part after a ';' is a cell of its own to a
// spreadsheet whose list separator is ';' (German, French, Dutch, Russian, … locales), and
// encoding/csv quotes a field only for a comma, a quote or a line break: such a part is kept from
// being a formula the same way. So is each part after a line break (staff notes may hold one):
// the same reader, splitting on ';', meets the field's quote mid-cell, ignores it and ends the
// row at the break, so the text after it begins a row of its own (an outside review).
func csvText(s string) string {
	var b strings.Builder
	for {
		part, sep, rest := s, "", ""
		if i := strings.IndexAny(s, ";\n\r"); i >= 0 {
			part, sep, rest = s[:i], s[i:i+1], s[i+1:]
		}
		if r, _ := utf8.DecodeRuneInString(strings.TrimLeft(s, " ")); strings.ContainsRune("=+-@\t\r＝＋－＠", r) {
			b.WriteByte('\'')
		}
		b.WriteString(part)
		if sep == "" {
			return b.String()
		}
		b.WriteString(sep)
		s = rest
	}
}
