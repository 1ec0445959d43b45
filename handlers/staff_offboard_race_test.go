package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/access"
	"pitlane/payments"
)

// waitBlockedBy waits until some backend of the test's database waits for a lock held by pid,
// and returns that backend's pid.
func waitBlockedBy(t *testing.T, b *consoleBench, pid int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var waiter int
		err := b.pool.QueryRow(context.Background(), `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE datname = current_database() AND $1::int = ANY(pg_blocking_pids(pid))`, pid).Scan(&waiter)
		if err != nil {
			t.Fatal(err)
		}
		if waiter != 0 {
			return waiter
		}
	}
	t.Fatalf("nothing ever waited for backend %d", pid)
	return 0
}

// holdRows begins a transaction that takes what lockSQL locks (it selects pg_backend_pid()) and
// returns it, its backend's pid for waitBlockedBy, and rolled back at the test's end if the
// test has not let it go.
func holdRows(t *testing.T, b *consoleBench, lockSQL string, args ...any) (pgx.Tx, int) {
	t.Helper()
	ctx := context.Background()
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	var pid int
	if err := holder.QueryRow(ctx, lockSQL, args...).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return holder, pid
}

// postAsync sends a form of agent a in the background (the agent's cookies and CSRF token) and
// delivers the answer on the returned channel.
func postAsync(b *consoleBench, a *agent, path string, form url.Values) <-chan *httptest.ResponseRecorder {
	form.Set("csrf_token", a.csrf)
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range a.jar.Cookies(a.site) {
		r.AddCookie(c)
	}
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		b.e.ServeHTTP(rec, r)
		done <- rec
	}()
	return done
}

// behindAnAdminsChange has root's change (path, form) wait for a moment on held's staff row
// (another transaction holds it, as any change of that account does), then actor's post (path,
// form) wait for root's, lets the row go, and wants root's change through (303); it returns
// actor's answer once it has one.
func behindAnAdminsChange(t *testing.T, b *consoleBench, root *agent, held, rootPath string, rootForm url.Values,
	actor *agent, actorPath string, actorForm url.Values) *httptest.ResponseRecorder {
	t.Helper()
	ctx := context.Background()
	holder, holderPID := holdRows(t, b, `SELECT pg_backend_pid() FROM staff_users WHERE email = $1 FOR UPDATE`, held)
	rootDone := postAsync(b, root, rootPath, rootForm)
	rootPID := waitBlockedBy(t, b, holderPID)
	actorDone := postAsync(b, actor, actorPath, actorForm)
	waitBlockedBy(t, b, rootPID)
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := <-rootDone; rec.Code != http.StatusSeeOther {
		t.Fatalf("root's change %s: %d", rootPath, rec.Code)
	}
	return <-actorDone
}

// Root offboards a compromised admin ("rogue": disables the account, replaces its password to
// throw the intruder out, or takes the admin role away). At the same moment the intruder, on
// rogue's session, sets the password of another staff user (carol). changeUser locks every
// enabled admin's row, so the intruder's change waits for root's to commit; it then went ahead
// as rogue all the same (Require had looked at rogue before the wait), and the intruder was back
// in the console as carol (an outside review). The change now holds the actor's own row too and
// checks the session again under it (payments.WithStaffSession): refused, nothing changed.
// Negative control: without actorStands every case fails.
func TestAnOffboardedAdminsChangeInFlightIsRefused(t *testing.T) {
	for _, offboard := range []struct {
		name        string
		path        string
		form        url.Values
		sessionEnds bool
	}{
		{"disable", "/disable", url.Values{}, true},
		{"password reset", "/password", url.Values{"password": {"root's fresh password for rogue"}}, true},
		{"demotion", "/role", url.Values{"role": {string(access.RoleSupport)}}, false},
	} {
		t.Run(offboard.name, func(t *testing.T) {
			b := newConsoleBench(t)
			ctx := context.Background()
			b.user(t, "root@example.com", access.RoleAdmin)  // lowest id
			b.user(t, "rogue@example.com", access.RoleAdmin) // then rogue
			b.user(t, "carol@example.com", access.RoleFinance)
			root, rogue := b.agent(t), b.agent(t)
			root.login("root@example.com")
			rogue.login("rogue@example.com")
			rogue.get("/admin/users") // the users page open in the intruder's tab

			// Something holds rogue's row for a moment (any change of rogue's account does):
			// root's offboarding locks root's row, then waits for rogue's; the intruder's change
			// (sent while rogue is still an enabled admin) waits for root's row.
			behindAnAdminsChange(t, b, root, "rogue@example.com", "/admin/users/"+b.userID(t, "rogue@example.com")+offboard.path, offboard.form,
				rogue, "/admin/users/"+b.userID(t, "carol@example.com")+"/password", url.Values{"password": {"the intruder's password"}})
			if rec := rogue.get("/"); offboard.sessionEnds && rec.Code != http.StatusSeeOther {
				t.Fatalf("rogue's session still works after the %s: %d", offboard.name, rec.Code)
			}

			setBy := ""
			_ = b.pool.QueryRow(ctx, `SELECT coalesce(password_set_by, '') FROM staff_users WHERE email = 'carol@example.com'`).Scan(&setBy)
			var disabledFirst bool
			_ = b.pool.QueryRow(ctx, `SELECT coalesce((SELECT id FROM audit_log WHERE action IN ('user.disable', 'user.password') AND target = 'rogue@example.com')
				< (SELECT id FROM audit_log WHERE action = 'user.password' AND target = 'carol@example.com'), false)`).Scan(&disabledFirst)
			intruder := b.agent(t)
			intruder.get("/login")
			signedIn := intruder.post("/login", url.Values{"email": {"carol@example.com"}, "password": {"the intruder's password"}}).Code == http.StatusSeeOther
			if setBy != "" || signedIn {
				t.Errorf("after root's %s of rogue committed, rogue's in-flight change still set carol's password "+
					"(password_set_by=%q, audited after the offboarding: %v); the intruder signs in as carol: %v",
					offboard.name, setBy, disabledFirst, signedIn)
			}
		})
	}
}

// Root demotes rogue to support while rogue's own click of "role = admin" on rogue's own row (the
// Users page offers the role form there too) waits for the rows the demotion holds. actorStands
// looked at the actor's role only for a change of someone else, so the click went on after the
// demotion and rogue was admin again, root told "rogue is now support" (a review). The role the
// request was let through with must still be the actor's, on their own row too. Negative
// control: without actorStands' role check, rogue is admin again.
func TestADemotedAdminsInFlightChangeOfTheirOwnRoleIsRefused(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	ctx := context.Background()
	b.user(t, "root@example.com", access.RoleAdmin)
	b.user(t, "rogue@example.com", access.RoleAdmin)
	root, rogue := b.agent(t), b.agent(t)
	root.login("root@example.com")
	rogue.login("rogue@example.com")
	rogue.get("/admin/users")
	rogueID := b.userID(t, "rogue@example.com")
	behindAnAdminsChange(t, b, root, "rogue@example.com", "/admin/users/"+rogueID+"/role", url.Values{"role": {string(access.RoleSupport)}},
		rogue, "/admin/users/"+rogueID+"/role", url.Values{"role": {string(access.RoleAdmin)}})
	var role string
	var selfAudited int
	if err := b.pool.QueryRow(ctx, `SELECT role, (SELECT count(*) FROM audit_log WHERE action = 'user.role' AND actor = 'rogue@example.com')
		FROM staff_users WHERE email = 'rogue@example.com'`).Scan(&role, &selfAudited); err != nil {
		t.Fatal(err)
	}
	if role != string(access.RoleSupport) || selfAudited != 0 {
		t.Errorf("root's demotion of rogue committed first; rogue's in-flight change of their own role then left rogue %s (%d audit entries by rogue)", role, selfAudited)
	}
}

// The role check above is for role changes and changes of others only: ana's own "sign out
// everywhere else" (a session she suspects stolen) waited for the rows of root's change of her
// role and was then refused "your role changed", her other session left signed in (a review of
// that check). Her own password and sessions need no role. Negative control: the role compared
// for every change, the epoch stays.
func TestAUsersOwnSignOutEverywhereStandsThroughAChangeOfTheirRole(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "root@example.com", access.RoleAdmin)
	b.user(t, "ana@example.com", access.RoleFinance)
	root, ana, other := b.agent(t), b.agent(t), b.agent(t)
	root.login("root@example.com")
	ana.login("ana@example.com")
	other.login("ana@example.com") // the session ana wants ended
	ana.get("/account")
	epoch := b.count(t, `SELECT session_epoch FROM staff_users WHERE email = 'ana@example.com'`)
	behindAnAdminsChange(t, b, root, "ana@example.com", "/admin/users/"+b.userID(t, "ana@example.com")+"/role", url.Values{"role": {string(access.RoleSupport)}},
		ana, "/account/sessions", url.Values{})
	if now := b.count(t, `SELECT session_epoch FROM staff_users WHERE email = 'ana@example.com'`); now == epoch {
		t.Errorf("ana's own 'sign out everywhere else' was refused because root changed her role meanwhile: session_epoch still %d", now)
	}
	if rec := other.get("/"); rec.Code != http.StatusSeeOther {
		t.Errorf("ana's other session still works: %d", rec.Code)
	}
}

// The same for a money action: a finance approval (four-eyes) waiting for the payment's locks
// while an admin disables the approver went on afterwards and settled the payment as that
// approver (staff-concurrency review, session 32: "ApproveResolution never re-reads the
// approver"). Every change made under a payment's locks now looks at the acting console
// session again under them (payments.WithStaffSession, queueStaffStands): refused, the proposal
// still waits. So when the approver is made support meanwhile (no four-eyes rights): the session
// stood, and the approval went on (an outside review); the role the request was let through with
// must still be the user's. Negative controls: without queueStaffStands in
// lockOrderAndSessionWith, both approved; without its role check, the demoted one.
func TestAnApprovalByAnOffboardedApproverInFlightIsRefused(t *testing.T) {
	t.Parallel()
	eachOffboarding(t, approvalOffboardedInFlight)
}

// offboarding is how an admin takes fin2's rights away on the Users page: the action's path
// and, for a role change, the new role.
type offboarding struct{ name, path, role string }

// eachOffboarding runs test once for a disable and once for a demotion to support.
func eachOffboarding(t *testing.T, test func(t *testing.T, off offboarding)) {
	for _, off := range []offboarding{{"disable", "/disable", ""}, {"demote to support", "/role", string(access.RoleSupport)}} {
		t.Run(off.name, func(t *testing.T) {
			t.Parallel()
			test(t, off)
		})
	}
}

// offboardedInFlight has fin2 post action (form) while another transaction holds a row it waits
// for (lockSQL, selecting pg_backend_pid() FOR UPDATE with arg), has root offboard fin2 meanwhile,
// lets the row go, and wants fin2's request refused with its message (303, Post/Redirect/Get),
// not failed.
func offboardedInFlight(t *testing.T, b *consoleBench, root, fin2 *agent, lockSQL string, arg any, action string, form url.Values, off offboarding) {
	t.Helper()
	ctx := context.Background()
	holder, holderPID := holdRows(t, b, lockSQL, arg)
	answered := postAsync(b, fin2, action, form)
	waitBlockedBy(t, b, holderPID) // fin2's request waits for the payment's locks
	change := url.Values{}
	if off.role != "" {
		change.Set("role", off.role)
	}
	if rec := root.post("/admin/users/"+b.userID(t, "fin2@example.com")+off.path, change); rec.Code != http.StatusSeeOther {
		t.Fatalf("root's %s of fin2: %d", off.path, rec.Code)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := <-answered; rec.Code != http.StatusSeeOther {
		t.Fatalf("fin2's %s in flight answered %d, want 303", action, rec.Code)
	}
}

func approvalOffboardedInFlight(t *testing.T, off offboarding) {
	b := newConsoleBench(t)
	b.user(t, "root@example.com", access.RoleAdmin)
	b.user(t, "fin@example.com", access.RoleFinance)
	b.user(t, "fin2@example.com", access.RoleFinance)
	ctx := context.Background()
	s := b.payment(t, "o-approve-offboard", 1000)
	b.flag(t, s.ID)
	p, err := b.svc.ProposeResolution(ctx, payments.Staff{Email: "fin@example.com", Role: string(access.RoleFinance)},
		payments.ProposalInput{SessionID: s.ID, Outcome: payments.StatusFailed, Reason: "never paid", Evidence: "gateway dashboard"})
	if err != nil {
		t.Fatal(err)
	}
	root, fin2 := b.agent(t), b.agent(t)
	root.login("root@example.com")
	fin2.login("fin2@example.com")
	root.get("/admin/users")
	doc := page(t, fin2.get("/finance/resolutions"), http.StatusOK)
	approve, ok := doc.Find(fmt.Sprintf(`[data-testid="resolution-row"][data-id="%d"] [data-testid="approve-form"]`, p.ID)).Attr("action")
	if !ok {
		t.Fatal("no approve form")
	}

	// Something holds the order for a moment (any action on the payment does).
	offboardedInFlight(t, b, root, fin2, `SELECT pg_backend_pid() FROM orders WHERE order_id = $1 FOR UPDATE`, s.OrderID, approve, url.Values{}, off)
	var state string
	if err := b.pool.QueryRow(ctx, `SELECT state FROM resolution_proposals WHERE id = $1`, p.ID).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if got, err := b.svc.Get(ctx, s.ID); err != nil || state != "proposed" || got.Status != s.Status {
		t.Fatalf("after root's %s of fin2, fin2's approval in flight left the proposal %s and the payment %s (%v): want it still waiting",
			off.path, state, got.Status, err)
	}
}

// The same for "Unlock codes": a finance user's unlock waiting for the payment's row while an
// admin disabled them (or made them support) went on afterwards and cleared the payment's wrong
// codes as that user — the unlock locked the row itself and never looked at the user again (an
// outside review). Negative control: without queueStaffStands in UnlockCodes, both clear them.
func TestAnUnlockByAnOffboardedUserInFlightIsRefused(t *testing.T) {
	t.Parallel()
	eachOffboarding(t, func(t *testing.T, off offboarding) {
		b := newConsoleBench(t)
		s := b.payment(t, "o-unlock-offboard", 1000)
		b.lockCodes(t, s.ID)
		root, fin2 := rootAndFin2(t, b, "/payments/"+s.ID)
		offboardedInFlight(t, b, root, fin2, `SELECT pg_backend_pid() FROM payment_sessions WHERE id = $1 FOR UPDATE`, s.ID,
			"/payments/"+s.ID+"/codes/unlock", url.Values{"reason": {"called the customer back"}}, off)
		if cleared := b.count(t, `SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1 AND cleared_at IS NOT NULL`, s.ID); cleared != 0 {
			t.Fatalf("after root's %s of fin2 committed, fin2's unlock in flight cleared %d wrong codes: want none", off.path, cleared)
		}
	})
}

// "Retry now" of a flagged payment locks the session's row and, like "Unlock codes" before its
// fix, never looked at its user again: a finance user disabled (or made support) while the retry
// waited for the row cleared the flag all the same, audited as made by a finance user. The same
// held for "Resolve" of a case (waiting for the case's row), the retry of a flagged refund and
// the rejection of a proposal: each looks again after its lock (payments.staffStands). From an
// outside review; negative control: staffStands doing nothing (the flag cleared, the case
// closed).
func TestARetryByAnOffboardedUserInFlightIsRefused(t *testing.T) {
	t.Parallel()
	eachOffboarding(t, func(t *testing.T, off offboarding) {
		b := newConsoleBench(t)
		s := b.payment(t, "o-retry-offboard", 1000)
		b.flag(t, s.ID)
		root, fin2 := rootAndFin2(t, b, "/finance/flagged")
		offboardedInFlight(t, b, root, fin2, `SELECT pg_backend_pid() FROM payment_sessions WHERE id = $1 FOR UPDATE`, s.ID,
			"/finance/flagged/"+s.ID+"/retry", url.Values{}, off)
		if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE id = $1 AND flagged_at IS NULL`, s.ID); n != 0 {
			roles := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND actor = 'fin2@example.com' AND role = 'finance'`, payments.AuditFlagRetry)
			t.Fatalf("after root's %s of fin2 committed, fin2's retry in flight cleared the flag (%d audit entries name fin2 as finance)", off.path, roles)
		}
	})
}

// The same for "Resolve" of a finance case, waiting for the case's row.
func TestACaseResolvedByAnOffboardedUserInFlightIsRefused(t *testing.T) {
	t.Parallel()
	eachOffboarding(t, func(t *testing.T, off offboarding) {
		b := newConsoleBench(t)
		s := b.payment(t, "o-case-offboard", 1000)
		var caseID int64
		if err := b.pool.QueryRow(context.Background(), `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at)
			VALUES ($1, $2, 'late_payment', 'probe', $3) RETURNING id`, s.ID, s.OrderID, b.clock.Now()).Scan(&caseID); err != nil {
			t.Fatal(err)
		}
		root, fin2 := rootAndFin2(t, b, "/finance/cases")
		offboardedInFlight(t, b, root, fin2, `SELECT pg_backend_pid() FROM finance_cases WHERE id = $1 FOR UPDATE`, caseID,
			fmt.Sprintf("/finance/cases/%d/resolve", caseID), url.Values{"note": {"refunded by hand"}}, off)
		if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE id = $1 AND resolved_at IS NOT NULL`, caseID); n != 0 {
			t.Fatalf("after root's %s of fin2 committed, fin2's resolve in flight closed the case", off.path)
		}
	})
}

// The same for "Reject" of a four-eyes proposal, waiting for the proposal's row.
func TestAProposalRejectedByAnOffboardedUserInFlightIsRefused(t *testing.T) {
	t.Parallel()
	eachOffboarding(t, func(t *testing.T, off offboarding) {
		b := newConsoleBench(t)
		s := b.payment(t, "o-reject-offboard", 1000)
		var id int64
		if err := b.pool.QueryRow(context.Background(), `INSERT INTO resolution_proposals
				(session_id, order_id, outcome, status_at_proposal, reason, evidence, proposed_by, proposed_at)
			VALUES ($1, $2, 'Failed', $3, 'r', 'e', 'fin1@example.com', $4) RETURNING id`,
			s.ID, s.OrderID, string(s.Status), b.clock.Now()).Scan(&id); err != nil {
			t.Fatal(err)
		}
		root, fin2 := rootAndFin2(t, b, "/finance/resolutions")
		offboardedInFlight(t, b, root, fin2, `SELECT pg_backend_pid() FROM resolution_proposals WHERE id = $1 FOR UPDATE`, id,
			fmt.Sprintf("/finance/resolutions/%d/reject", id), url.Values{"note": {"the bank shows nothing yet"}}, off)
		if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state <> 'proposed'`, id); n != 0 {
			t.Fatalf("after root's %s of fin2 committed, fin2's rejection in flight decided the proposal", off.path)
		}
	})
}

// rootAndFin2 makes and signs in an admin (root, on the users page) and a finance user (fin2, on
// the page at from), as the offboarding-in-flight tests begin.
func rootAndFin2(t *testing.T, b *consoleBench, from string) (root, fin2 *agent) {
	t.Helper()
	b.user(t, "root@example.com", access.RoleAdmin)
	b.user(t, "fin2@example.com", access.RoleFinance)
	root, fin2 = b.agent(t), b.agent(t)
	root.login("root@example.com")
	fin2.login("fin2@example.com")
	root.get("/admin/users")
	page(t, fin2.get(from), http.StatusOK)
	return root, fin2
}
