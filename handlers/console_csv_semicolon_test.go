package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"pitlane/access"
)

// A case note reaches the audit CSV (ledger review, session 30). Excel in the many locales
// whose list separator is ";" (de, fr, nl, ru, …) splits a .csv on ";", so an unquoted cell
// "late_payment: ok;=1+1" opens as two cells, the second the formula =1+1. csvText looked at a
// cell's first character only, and encoding/csv quotes a field only for , " or a line break: each
// part after a ";" is now kept from being a formula as a cell's start is. Negative control: csvText
// looking at the first character only gives the cell "=1+1".
//
// A note may hold a line break too: the same reader meets the field's quote mid-cell (the row's
// earlier fields are in the same ';'-cell), ignores it, and ends the row at the break, so the text
// after it begins a row of its own, its first cell a formula (hostile-input review, session 32).
// Each part after a line break is kept the same way. Negative control: csvText splitting on ';'
// only gives the row "=1+1;see ticket".
func TestAuditCSVKeepsFormulasOutAfterASemicolon(t *testing.T) {
	t.Parallel()
	for _, note := range []string{"refunded at the bank;=1+1; @SUM(A1)", "refunded at the bank\n=1+1;see ticket", "refunded at the bank\r\n+1+1"} {
		t.Run(strconv.Quote(note), func(t *testing.T) {
			t.Parallel()
			b := newConsoleBench(t)
			b.user(t, "fin@example.com", access.RoleFinance)
			b.user(t, "adm@example.com", access.RoleAdmin)
			ctx := context.Background()
			var id int64
			if err := b.pool.QueryRow(ctx, `INSERT INTO finance_cases (kind, detail, created_at) VALUES ('late_payment', 'x', now()) RETURNING id`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			fin := b.agent(t)
			fin.login("fin@example.com")
			fin.get("/finance/cases")
			if rec := fin.post("/finance/cases/"+strconv.FormatInt(id, 10)+"/resolve", url.Values{"note": {note}}); rec.Code >= 400 {
				t.Fatalf("resolve: %d %s", rec.Code, rec.Body)
			}
			adm := b.agent(t)
			adm.login("adm@example.com")
			rec := adm.get("/admin/audit.csv?actor=fin%40example.com")
			if rec.Code != http.StatusOK {
				t.Fatalf("audit.csv: %d", rec.Code)
			}
			if !strings.Contains(rec.Body.String(), "refunded at the bank") {
				t.Fatalf("the note is not in the export:\n%s", rec.Body)
			}
			// Read as that spreadsheet does: rows at every line break, cells at every ';'.
			for _, line := range strings.FieldsFunc(rec.Body.String(), func(r rune) bool { return r == '\n' || r == '\r' }) {
				for _, cell := range strings.Split(line, ";") {
					if c := strings.TrimLeft(cell, " "); c != "" && strings.ContainsRune("=@+", rune(c[0])) {
						t.Errorf("read with the ';' list separator, a row has the formula cell %q (row %q)", cell, line)
					}
				}
			}
		})
	}
}
