package handlers_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// A finance user unlocks a payment's codes with the payment's id in upper case in the path (the
// route takes it: a uuid column matches either case). The entry was filed under the upper-case
// id, which neither the payment's page nor the audit page filtered on the payment looks for: a
// staff action kept off the payment's history by typing its id otherwise. Path ids are made
// canonical before the handlers (web's canonicalIDs), and the core audits the id as stored.
// From an outside review; negative control: without canonicalIDs and the core's ids as stored,
// "Staff actions: None".
func TestAStaffActionOnAnUpperCaseIDIsOnThePaymentsAudit(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	s := b.payment(t, "o-codes-upper", 1500)
	b.lockCodes(t, s.ID)
	b.user(t, "fin@example.com", access.RoleFinance)
	fin := b.agent(t)
	fin.login("fin@example.com")

	doc := page(t, fin.get("/payments/"+s.ID), http.StatusOK)
	action, form := formValues(doc, "codes-unlock-form")
	form.Set("reason", "customer verified by a call back")
	upper := strings.Replace(action, s.ID, strings.ToUpper(s.ID), 1)
	if upper == action {
		t.Fatalf("the form's action %q does not hold the payment's id", action)
	}
	fin.follow(fin.post(upper, form))
	if n := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1 AND cleared_at IS NOT NULL`, s.ID); n == 0 {
		t.Fatal("the unlock did not happen")
	}
	doc = page(t, fin.get("/payments/"+s.ID), http.StatusOK)
	if got := doc.Find("#payment-audit").Text(); !strings.Contains(got, payments.AuditCodesUnlock) {
		t.Fatalf("the codes were unlocked, but the payment's Staff actions say: %q", strings.Join(strings.Fields(got), " "))
	}
	b.user(t, "adm@example.com", access.RoleAdmin)
	adm := b.agent(t)
	adm.login("adm@example.com")
	doc = page(t, adm.get("/admin/audit?target="+s.ID), http.StatusOK)
	if got := doc.Text(); !strings.Contains(got, payments.AuditCodesUnlock) {
		t.Fatal("the audit page filtered on the payment's id does not list the unlock")
	}
}

// Staff emails are stored normalised (lower case), and so is every entry's actor; the audit
// page's filter was compared as typed: an admin looking up a colleague by the address as HR wrote
// it ("Sup@Example.com") was told "Nothing recorded." while the log held that user's sign-in. The
// filter is normalised as the log is, actor and target (a user's changes are filed under their
// email). From an outside review; negative control: the filter as typed.
func TestTheAuditFilterFindsAStaffMemberWhateverTheCase(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "adm@example.com", access.RoleAdmin)
	b.user(t, "sup@example.com", access.RoleSupport)
	sup := b.agent(t)
	sup.login("Sup@Example.com") // signs in: the address is normalized
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE actor = 'sup@example.com' AND action = $1`, payments.AuditLogin); n != 1 {
		t.Fatalf("%d sign-in entries for sup@example.com, want 1", n)
	}
	adm := b.agent(t)
	adm.login("adm@example.com")
	for _, filter := range []string{"actor", "target"} {
		doc := page(t, adm.get("/admin/audit?"+filter+"="+url.QueryEscape("Sup@Example.com")), http.StatusOK)
		if n := doc.Find(testid("audit-row")).Length(); n == 0 {
			t.Errorf("the audit page filtered on %s Sup@Example.com lists nothing (%q); the log holds its sign-in under sup@example.com",
				filter, strings.TrimSpace(doc.Find(testid("audit-empty")).Text()))
		}
	}
}
