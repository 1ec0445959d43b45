package handlers_test

import (
	"context"
	"encoding/csv"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// TestAuditCSVExport: the audit page shows the newest 200 entries; its CSV download has every
// entry under the page's filter, oldest first, with text cells kept from being read as formulas,
// and the export is audited itself.
func TestAuditCSVExport(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "adm@example.com", access.RoleAdmin)
	ctx := context.Background()
	// More entries than the page shows, one of them a detail someone typed as a formula.
	if _, err := b.pool.Exec(ctx, `INSERT INTO audit_log (at, actor, role, action, target, detail)
		SELECT $1, 'sup@example.com', 'support', 'payment.check', 'p-' || i, 'checked ' || i FROM generate_series(1, 700) i`, consoleT0); err != nil {
		t.Fatal(err)
	}
	if err := b.svc.RecordAudit(ctx, payments.AuditEntry{Actor: "sup@example.com", Role: "support", Action: payments.AuditCaseResolve,
		Target: "＝1+1", Detail: `=HYPERLINK("http://evil.example","click")`}); err != nil { // a full-width "=" some spreadsheets read as "="
		t.Fatal(err)
	}
	adm := b.agent(t)
	adm.login("adm@example.com")

	doc := page(t, adm.get("/admin/audit?actor=sup@example.com"), http.StatusOK)
	if n := doc.Find(testid("audit-row")).Length(); n != 200 {
		t.Fatalf("the page shows %d entries, want the newest 200", n)
	}
	href, _ := doc.Find(testid("audit-export")).Attr("href")
	if href != "/admin/audit.csv?actor=sup%40example.com" {
		t.Fatalf("export link %q", href)
	}
	rec := adm.get(href)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/csv; charset=utf-8" ||
		!strings.HasPrefix(rec.Header().Get("Content-Disposition"), `attachment; filename="pitlane-audit-`) || !rec.Flushed {
		t.Fatalf("csv: %d %v flushed=%v", rec.Code, rec.Header(), rec.Flushed)
	}
	recs, err := csv.NewReader(strings.NewReader(rec.Body.String())).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+701 || strings.Join(recs[0], ",") != "id,at,actor,role,action,target,detail" {
		t.Fatalf("%d records (want a header and all 701 of the actor's), header %v", len(recs), recs[0])
	}
	if recs[1][5] != "p-1" || recs[700][5] != "p-700" {
		t.Fatalf("not oldest first: %v … %v", recs[1], recs[700])
	}
	if last := recs[701]; last[4] != payments.AuditCaseResolve || last[6] != `'=HYPERLINK("http://evil.example","click")` || last[5] != "'＝1+1" {
		t.Fatalf("the typed formulas went out as %q and %q", last[5], last[6])
	}
	if n := b.audits(t, payments.AuditAuditExport, "audit_log"); n != 1 {
		t.Fatalf("the export audited %d times, want 1", n)
	}
	rec = adm.get("/admin/audit.csv?target=" + url.QueryEscape("＝1+1"))
	if recs, _ := csv.NewReader(strings.NewReader(rec.Body.String())).ReadAll(); len(recs) != 2 {
		t.Fatalf("the target filter: %d records", len(recs))
	}
}
