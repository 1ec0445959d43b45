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
func TestAuditCSVKeepsFormulasOutAfterASemicolon(t *testing.T) {
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
	if rec := fin.post("/finance/cases/"+strconv.FormatInt(id, 10)+"/resolve", url.Values{"note": {"refunded at the bank;=1+1; @SUM(A1)"}}); rec.Code >= 400 {
		t.Fatalf("resolve: %d %s", rec.Code, rec.Body)
	}
	adm := b.agent(t)
	adm.login("adm@example.com")
	rec := adm.get("/admin/audit.csv?actor=fin%40example.com")
	if rec.Code != http.StatusOK {
		t.Fatalf("audit.csv: %d", rec.Code)
	}
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.Contains(line, "refunded at the bank") {
			t.Logf("row: %s", line)
			for _, cell := range strings.Split(line, ";") {
				if c := strings.TrimLeft(cell, " "); strings.HasPrefix(c, "=") || strings.HasPrefix(c, "@") {
					t.Errorf("read with the ';' list separator, the row has the formula cell %q", cell)
				}
			}
			return
		}
	}
	t.Fatalf("the note is not in the export:\n%s", rec.Body)
}
