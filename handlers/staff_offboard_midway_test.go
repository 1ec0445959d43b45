package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Staff offboarded while their action is on its way (staff_offboard_race_test.go has the rest).
//
// "Start a payment" (POST /payments) by a support user whose request waits for the order's
// claim lock while an admin offboards them (disables them, or makes them finance: no
// PermOperate). Every other staff change re-reads the acting session under its locks; Create's
// claim did not, so the offboarded user's click still created a session and registered it at
// the gateway (an outside review, staff).
func TestAStartByAUserOffboardedWhileItWaitedIsRefused(t *testing.T) {
	t.Parallel()
	for _, off := range []offboarding{{"disable", "/disable", ""}, {"demote to finance", "/role", string(access.RoleFinance)}} {
		t.Run(off.name, func(t *testing.T) {
			t.Parallel()
			b := newConsoleBench(t)
			ctx := context.Background()
			b.user(t, "root@example.com", access.RoleAdmin)
			b.user(t, "sup2@example.com", access.RoleSupport)
			root, sup2 := b.agent(t), b.agent(t)
			root.login("root@example.com")
			sup2.login("sup2@example.com")
			root.get("/admin/users")
			page(t, sup2.get("/payments/new"), http.StatusOK)
			const order = "o-create-offboard"

			// Something holds the order's claim lock for a moment (another Create of the order does).
			holder, holderPID := holdRows(t, b, `SELECT pg_backend_pid() FROM (SELECT pg_advisory_xact_lock($1, hashtext($2))) l`,
				int32(payments.LockCreateOrder), order)
			registersBefore := b.gw.Calls("register")
			answered := postAsync(b, sup2, "/payments", url.Values{"order_id": {order}, "amount": {"19.99"}, "currency": {"EUR"},
				"customer_contact": {"cust@example.com"}})
			waitBlockedBy(t, b, holderPID) // sup2's create waits for the order's lock
			change := url.Values{}
			if off.role != "" {
				change.Set("role", off.role)
			}
			if rec := root.post("/admin/users/"+b.userID(t, "sup2@example.com")+off.path, change); rec.Code != http.StatusSeeOther {
				t.Fatalf("root's %s of sup2: %d", off.path, rec.Code)
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			rec := <-answered
			sessions := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, order)
			registers := b.gw.Calls("register") - registersBefore
			audited := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND actor = 'sup2@example.com' AND role = 'support' AND detail NOT LIKE 'refused%'`,
				payments.AuditPaymentCreate)
			var status, auditRows string
			_ = b.pool.QueryRow(ctx, `SELECT coalesce(string_agg(status, ','), '') FROM payment_sessions WHERE order_id = $1`, order).Scan(&status)
			_ = b.pool.QueryRow(ctx, `SELECT coalesce(string_agg(actor || '/' || role || ': ' || detail, ' | '), '') FROM audit_log WHERE action = $1`,
				payments.AuditPaymentCreate).Scan(&auditRows)
			t.Logf("sessions of the order: [%s]; payment.create audit: [%s]; page says: %q", status, auditRows, text(page(t, rec, rec.Code), "new-payment-error"))
			if sessions != 0 || registers != 0 {
				t.Fatalf("after root's %s of sup2 committed, sup2's create in flight (answer %d) made %d session(s) of the order, "+
					"%d gateway registration(s), %d audit entries naming sup2 as support: want none",
					off.name, rec.Code, sessions, registers, audited)
			}
		})
	}
}

// The slow gateway. sup2 starts a payment while enabled; the claim commits (a Registering
// session) and the registration goes to the gateway; while the gateway takes its time an admin
// disables sup2 (or makes them finance). The gateway registers the payment, and its answer's
// apply was refused under the payment's locks (the staff session no longer stood): the order was
// left with a Registering session that had a payment at the gateway, while the page and the
// audit log said "nothing was changed" (an outside review, staff). The action was committed
// and sent: its outcome is written whoever the actor is by then (detachRecord).
func TestAStartCarriedOutWhileItsUserWasOffboardedIsRecorded(t *testing.T) {
	t.Parallel()
	for _, off := range []offboarding{{"disable", "/disable", ""}, {"demote to finance", "/role", string(access.RoleFinance)}} {
		t.Run(off.name, func(t *testing.T) {
			t.Parallel()
			b := newConsoleBench(t)
			ctx := context.Background()
			b.user(t, "root@example.com", access.RoleAdmin)
			b.user(t, "sup2@example.com", access.RoleSupport)
			root, sup2 := b.agent(t), b.agent(t)
			root.login("root@example.com")
			sup2.login("sup2@example.com")
			root.get("/admin/users")
			page(t, sup2.get("/payments/new"), http.StatusOK)
			const order = "o-create-slow-gw"

			gate := b.gw.Hold(fakegw.OpRegister)
			answered := postAsync(b, sup2, "/payments", url.Values{"order_id": {order}, "amount": {"19.99"}, "currency": {"EUR"},
				"customer_contact": {"cust@example.com"}})
			<-gate.Arrived() // the claim committed; the gateway is registering
			change := url.Values{}
			if off.role != "" {
				change.Set("role", off.role)
			}
			if rec := root.post("/admin/users/"+b.userID(t, "sup2@example.com")+off.path, change); rec.Code != http.StatusSeeOther {
				t.Fatalf("root's %s of sup2: %d", off.path, rec.Code)
			}
			gate.Open()
			rec := <-answered
			var status, gwID string
			if err := b.pool.QueryRow(ctx, `SELECT status, coalesce(gateway_payment_id, '') FROM payment_sessions WHERE order_id = $1`, order).Scan(&status, &gwID); err != nil {
				t.Fatal(err)
			}
			said := text(page(t, rec, rec.Code), "new-payment-error")
			t.Logf("answer %d %q; session %s, gateway payment %q; gateway registrations %d", rec.Code, said, status, gwID, b.gw.Payments())
			if b.gw.Payments() == 1 && (status == string(payments.StatusRegistering) || strings.Contains(said, "nothing was changed")) {
				t.Fatalf("after root's %s of sup2 landed during the gateway's registration, the gateway holds the payment but the session is left %s "+
					"(gateway id %q) and the page says %q", off.name, status, gwID, said)
			}
		})
	}
}

// The same for a confirmed cancel. The code is consumed and the session is Canceling
// (committed while sup2 was enabled); the reverse goes to the gateway; sup2 is disabled while
// the gateway answers; the reverse's apply was refused under the payment's locks: the gateway
// had reversed the payment and the session stayed Canceling until the patrol asked again.
func TestACancelCarriedOutWhileItsUserWasOffboardedIsRecorded(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	ctx := context.Background()
	b.user(t, "root@example.com", access.RoleAdmin)
	b.user(t, "sup2@example.com", access.RoleSupport)
	root, sup2 := b.agent(t), b.agent(t)
	root.login("root@example.com")
	sup2.login("sup2@example.com")
	root.get("/admin/users")
	s := b.payment(t, "o-cancel-slow-gw", 1500)
	page(t, sup2.get("/payments/"+s.ID), http.StatusOK)
	loc := sup2.post("/payments/"+s.ID+"/cancel", cancelForm()).Header().Get("Location")
	u, err := url.Parse(loc)
	if err != nil || u.Query().Get("challenge") == "" {
		t.Fatalf("request cancel → %q %v", loc, err)
	}
	var body string
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1 ORDER BY id DESC LIMIT 1`, s.ID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	page(t, sup2.get(loc), http.StatusOK)

	gate := b.gw.Hold(fakegw.OpReverse)
	answered := postAsync(b, sup2, "/payments/"+s.ID+"/cancel/"+u.Query().Get("challenge"), url.Values{"code": {outboxCodeRe.FindStringSubmatch(body)[1]}})
	<-gate.Arrived() // the cancel committed (Canceling); the gateway is reversing
	if rec := root.post("/admin/users/"+b.userID(t, "sup2@example.com")+"/disable", url.Values{}); rec.Code != http.StatusSeeOther {
		t.Fatalf("root's disable of sup2: %d", rec.Code)
	}
	gate.Open()
	rec := <-answered
	got, err := b.svc.Get(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	gp, _ := b.gw.Payment(s.GatewayPaymentID)
	var audit string
	_ = b.pool.QueryRow(ctx, `SELECT coalesce(string_agg(actor || ': ' || detail, ' | ' ORDER BY id), '') FROM audit_log WHERE action = $1 AND target = $2`,
		payments.AuditCancelConfirm, s.ID).Scan(&audit)
	t.Logf("answer %d → %s; session %s; gateway says %s; reverses %d; cancel.confirm audit: [%s]", rec.Code, rec.Header().Get("Location"),
		got.Status, gp.Status, b.gw.Calls(fakegw.OpReverse), audit)
	if gp.Status == payments.GatewayReversed && got.Status == payments.StatusCanceling {
		t.Fatalf("after root's disable of sup2 landed during the gateway's reverse, the gateway reversed the payment but the session is left %s", got.Status)
	}
}
