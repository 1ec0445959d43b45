package handlers_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"pitlane/access"
)

// describedBy is the text of the elements a field's aria-describedby names.
func describedBy(doc *goquery.Document, field *goquery.Selection) string {
	ids, _ := field.Attr("aria-describedby")
	var out []string
	for _, id := range strings.Fields(ids) {
		out = append(out, strings.TrimSpace(doc.Find("#"+id).Text()))
	}
	return strings.Join(out, " ")
}

// Refusals that say what and where (an outside review, a11y, fourth pass: WCAG 3.3.1, 3.3.3,
// 3.3.7).

// A finance user picks a From day after the To day in the ledger's date pickers (or types "EU"
// in Currency). The answer is the ledger with its filter form as typed and the field at fault
// tied to the reason (422), as the other console forms do; it was the bare error page
// ("Unprocessable Entity"): no filter form, nothing typed shown.
func TestARefusedLedgerFilterKeepsTheForm(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "fin@example.com", access.RoleFinance)
	fin := b.agent(t)
	fin.login("fin@example.com")

	for _, c := range []struct{ query, field string }{
		{"from=2026-12-01&to=2026-11-01&currency=EUR&type=PaymentReceived", "ledger-to"},
		{"from=2026-11-01&to=2026-11-30&currency=EU", "ledger-currency"},
	} {
		rec := fin.get("/finance/ledger?" + c.query)
		doc, err := goquery.NewDocumentFromReader(strings.NewReader(rec.Body.String()))
		if err != nil {
			t.Fatal(err)
		}
		if doc.Find(testid("ledger-filters")).Length() == 0 {
			t.Errorf("%s: answered %d %q (%q) with no filter form: what was typed is gone, the way back is the browser's Back",
				c.query, rec.Code, strings.TrimSpace(doc.Find("h1").Text()), text(doc, "error-detail"))
			continue
		}
		q, _ := url.ParseQuery(c.query)
		if v, _ := doc.Find(testid("ledger-from")).Attr("value"); v != q.Get("from") {
			t.Errorf("%s: From shows %q", c.query, v)
		}
		f := doc.Find(testid(c.field))
		if inv, _ := f.Attr("aria-invalid"); inv != "true" || describedBy(doc, f) == "" {
			t.Errorf("%s: the field at fault (%s) is not tied to the reason", c.query, c.field)
		}
	}
}

// The users page has one "new password for X" field per user. An admin sends bo's empty or one
// the server counts shorter than the browser does (6 emoji are 12 UTF-16 units for minlength, 6
// characters for the server). The page came back with "the password must be at least 12
// characters" at its top: whose password, nothing said.
func TestARefusedUserChangeSaysWhose(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "root@example.com", access.RoleAdmin)
	b.user(t, "ana@example.com", access.RoleSupport)
	b.user(t, "bo@example.com", access.RoleSupport)
	adm := b.agent(t)
	adm.login("root@example.com")

	for _, pw := range []string{"", "🔑🔑🔑🔑🔑🔑"} {
		doc := page(t, adm.follow(adm.post("/admin/users/"+b.userID(t, "bo@example.com")+"/password", url.Values{"password": {pw}})), http.StatusOK)
		msg := text(doc, "flash-error")
		if msg == "" {
			t.Fatalf("%q: no refusal shown", pw)
		}
		field := doc.Find(`[data-testid="user-row"][data-email="bo@example.com"] input[name="password"]`)
		inv, _ := field.Attr("aria-invalid")
		if !strings.Contains(msg, "bo@example.com") && (inv != "true" || describedBy(doc, field) == "") {
			t.Errorf("password %q refused with %q: neither the message nor bo's field says it is bo's password (%d password fields on the page)",
				pw, msg, doc.Find(`input[name="password"]`).Length())
		}
	}
}

// The four-eyes page's Reject form sent its note with a Post/Redirect/Get: a note the server
// refuses — one with a control character in it, or one of spaces and line breaks only (the
// textarea's required lets it through) — came back as a flash at the top of the list, the note
// gone, and with several proposals waiting nothing said which one's (the cases page's Resolve
// form was fixed for this: caseFormAgain). Now the page holds the note in its form, tied to the
// refusal (422). A manual line break pasted from a word processor (U+000B) was refused as a
// control character nobody sees: it is a line break.
func TestARefusedRejectKeepsTheNote(t *testing.T) {
	t.Parallel()
	b, unknown, flagged, _ := stuckBench(t)
	fin, fin2 := b.agent(t), b.agent(t)
	fin.login("fin@example.com")
	fin2.login("fin2@example.com")
	propose := func(id, outcome string) string {
		rec := fin.post("/finance/resolutions", url.Values{"session": {id}, "outcome": {outcome}, "seen": {""},
			"reason": {"r"}, "evidence": {"e"}})
		loc := rec.Header().Get("Location")
		if !strings.HasPrefix(loc, "/finance/resolutions#proposal-") {
			t.Fatalf("propose → %d %s", rec.Code, rec.Body)
		}
		return strings.TrimPrefix(loc, "/finance/resolutions#proposal-")
	}
	first := propose(flagged.ID, "Completed")
	propose(unknown.ID, "Failed")

	doc := page(t, fin2.get("/finance/resolutions"), http.StatusOK)
	row := `[data-testid="resolution-row"][data-id="` + first + `"] `
	action, _ := doc.Find(row + testid("reject-form")).Attr("action")
	for _, note := range []string{
		"The bank statement of 30 Nov shows no capture:\x01 ticket FIN-12 has the PDF.",
		" \n ",
	} {
		rec := fin2.post(action, url.Values{"note": {note}})
		if rec.Code == http.StatusSeeOther {
			rec = fin2.follow(rec)
		}
		doc, err := goquery.NewDocumentFromReader(strings.NewReader(rec.Body.String()))
		if err != nil {
			t.Fatal(err)
		}
		msg := text(doc, "flash-error")
		ta := doc.Find(row + testid("reject-note"))
		if strings.TrimSpace(note) != "" && ta.Text() != note {
			t.Errorf("note %q refused (%q): the form comes back with %q", note, msg, ta.Text())
		}
		if inv, _ := ta.Attr("aria-invalid"); inv != "true" && !strings.Contains(msg, "#"+first) {
			t.Errorf("note %q refused with %q: neither the message nor proposal #%s's note field says which proposal", note, msg, first)
		}
	}
	rec := fin2.post(action, url.Values{"note": {"The bank statement of 30 Nov shows no capture:\vticket FIN-12 has the PDF."}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("a note with a pasted manual line break: %d %s", rec.Code, text(page(t, rec, rec.Code), "flash-error"))
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND decision_note = $2`, first,
		"The bank statement of 30 Nov shows no capture:\nticket FIN-12 has the PDF."); n != 1 {
		t.Fatalf("the note's manual line break was not kept as a line break")
	}
}
