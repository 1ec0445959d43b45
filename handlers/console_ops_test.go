package handlers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/payments"
)

// opsDay gives the bench something to draw: payments through the core (their gateway calls),
// two minutes of samples, and this replica's patrol heartbeat.
func (b *consoleBench) opsDay(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	paid := b.payment(t, "o-ops-paid", 1999)
	b.payment(t, "o-ops-open", 500)
	if _, err := b.svc.SampleOps(ctx); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, paid.ID); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	// A sample counts settlements below the oldest transaction running in the cluster, which the
	// parallel tests share (payments' opsSampleSQL): wait until the payment's Completed is below
	// it, or it would be counted by a sample this test never takes.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var counted bool
		if err := b.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM session_events
			WHERE xid >= pg_snapshot_xmin(pg_current_snapshot()))`).Scan(&counted); err != nil {
			t.Fatal(err)
		}
		if counted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a transaction in the test cluster has been running for a minute: the sample cannot count the payment")
		}
	}
	if _, err := b.svc.SampleOps(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestOpsPage: the Operations page through the router — in the nav for every role, its charts
// drawn from the database (samples, gateway calls, heartbeats), and an htmx request of the same
// URL gets only the charts' fragment.
func TestOpsPage(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	b.opsDay(t)
	a := b.agent(t)
	a.login("sup@example.com")

	doc := page(t, a.get("/"), 200)
	if href, _ := doc.Find(testid("nav-ops")).Attr("href"); href != "/ops" {
		t.Fatalf("nav link to the Operations page: %q", href)
	}
	doc = page(t, a.get("/ops"), 200)
	wantText(t, doc, "ops-title", "Operations")
	if !doc.Find(testid("nav-ops")).HasClass("active") {
		t.Fatal("Operations is not the active nav entry")
	}
	for _, id := range []string{"chart-sessions", "chart-settled", "chart-gateway", "chart-backlog", "chart-replicas"} {
		if doc.Find(testid(id)).Length() != 1 {
			t.Fatalf("chart %s missing", id)
		}
	}
	// Two sampled minutes in the last half hour: Registered 2, then Registered 1 and 1 settled.
	if rows := doc.Find(testid("sessions-row")); rows.Length() != 1 || !strings.Contains(rows.Text(), "09:00") {
		t.Fatalf("sessions table rows: %q", rows.Text())
	}
	if n := doc.Find(testid("chart-settled") + " " + testid("bar")).Length(); n != 1 {
		t.Fatalf("%d settled bars, want 1 (the Completed payment)", n)
	}
	// Two registrations at 09:00, the Check's status call at 09:01, the patrol's look at the
	// open payment at 09:02: three minutes with calls.
	if n := doc.Find(testid("gateway-row")).Length(); n != 3 {
		t.Fatalf("%d gateway minutes with calls, want 3", n)
	}
	if got := text(doc, "replica-row-state"); got != "sweeping" {
		t.Fatalf("replica state %q", got)
	}
	if got := text(doc, "webhook-state"); got != "off" { // no EVENTS_WEBHOOK_URL in the bench
		t.Fatalf("events webhook state %q", got)
	}
	if doc.Find(`[style]`).Length() != 0 || doc.Find(`script:not([src])`).Length() != 0 {
		t.Fatal("inline style or script on the Operations page")
	}

	rec := a.get("/ops", "HX-Request", "true")
	frag := page(t, rec, 200)
	if strings.Contains(rec.Body.String(), "<html") || frag.Find(testid("ops-title")).Length() != 0 {
		t.Fatal("the htmx request got the whole page")
	}
	if frag.Find(testid("ops-live")).Length() != 1 || frag.Find(testid("chart-gateway")).Length() != 1 || frag.Find(testid("events-webhook")).Length() != 1 {
		t.Fatalf("the fragment lacks the charts: %.300s", rec.Body.String())
	}
}

// The events webhook's card while the shop fails: the failures, what waits, and for an admin
// (only) "Send now", which ends the wait, says so and is audited.
func TestOpsEventsWebhookSendNow(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	b.user(t, "adm@example.com", access.RoleAdmin)
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO events_webhook (cursor, started_at, attempts, next_attempt_at, last_error)
		VALUES ('', $1, 3, $2, 'the shop''s endpoint answered 502')`, consoleT0, consoleT0.Add(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	sup := b.agent(t)
	sup.login("sup@example.com")
	doc := page(t, sup.get("/ops"), 200)
	if got := text(doc, "webhook-state"); got != "failing" {
		t.Fatalf("state %q", got)
	}
	wantText(t, doc, "webhook-failing", "3 failed POSTs in a row")
	wantText(t, doc, "webhook-failing", "answered 502")
	if doc.Find(testid("webhook-waiting")).Length() != 1 { // (how many: the feed lags behind other tests' open transactions)
		t.Fatal("no waiting line")
	}
	if doc.Find(testid("webhook-retry-form")).Length() != 0 {
		t.Fatal("support is offered Send now")
	}

	adm := b.agent(t)
	adm.login("adm@example.com")
	doc = page(t, adm.get("/ops"), 200)
	action, ok := doc.Find(testid("webhook-retry-form")).Attr("action")
	if !ok {
		t.Fatal("no Send now for an admin")
	}
	doc = page(t, adm.follow(adm.post(action, nil)), 200)
	wantText(t, doc, "flash", "sends again on the next round")
	if doc.Find(testid("webhook-retry-form")).Length() != 0 {
		t.Fatal("Send now still offered once the wait ended")
	}
	if n := b.count(t, `SELECT count(*) FROM events_webhook WHERE next_attempt_at IS NULL AND attempts = 3`); n != 1 {
		t.Fatal("the wait did not end (or the failures were forgotten)")
	}
	if b.audits(t, payments.AuditEventsWebhookRetry, "events_webhook") != 1 {
		t.Fatal("send now not audited")
	}
	doc = page(t, adm.follow(adm.post(action, nil)), 200)
	wantText(t, doc, "flash-error", "not waiting to retry")
}
