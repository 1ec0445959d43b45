package payments_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// snapshotDatabase copies the database at dbURL (no connection may be open on it: they are
// ended first) into a new one, dropped when the test ends, and returns the copy's URL: the
// state a restore to this moment brings back.
func snapshotDatabase(t *testing.T, dbURL string) string {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	src := strings.TrimPrefix(u.Path, "/")
	dst := fmt.Sprintf("pitr_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, testdb.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, src); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{dst}.Sanitize()+` TEMPLATE `+pgx.Identifier{src}.Sanitize()); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testdb.ServerURL(t))
		if err == nil {
			_, _ = c.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{dst}.Sanitize()+` WITH (FORCE)`)
			c.Close(context.Background())
		}
	})
	u.Path = "/" + dst
	return u.String()
}

// The point-in-time recovery runbook (docs/operations.md), played through: the database goes
// back to a restore point while the gateway keeps everything that happened since.
//
//  1. `pitlane reconcile --since` brings the restored sessions to the gateway's word through the
//     normal apply path: a session restored as Registered that the customer paid after the
//     restore point becomes Completed with one PaymentReceived entry; money for a session that
//     is Failed in the restored state becomes a late_payment case (never a second effect).
//  2. A session created after the restore point is gone while its gateway payment exists: its
//     webhook is recorded as unknown_payment (the runbook's query finds it), nothing applied.
//  3. The shop retrying that order creates a new session (the gap's keys are gone) and the
//     per-order claim still holds: its retries answer with that one session.
func TestPointInTimeRecoveryRunbook(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()

	// Before the restore point.
	paidLater := b.registered(t, "o-paid-later", 1000)
	failed := b.registered(t, "o-failed", 500)
	b.gw.SetStatus(failed.GatewayPaymentID, payments.GatewayDeclined)
	if s, err := b.plain.Check(ctx, api, failed.ID); err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	b.clock.Advance(time.Minute)
	b.pool.Close()
	restoredURL := snapshotDatabase(t, b.url)

	// After it: work the restore will lose, and what the gateway keeps of it.
	livePool := testdb.Pool(t, b.url)
	live := b.service(livePool, "replica-live")
	b.clock.Advance(10 * time.Minute)
	b.gw.SetStatus(paidLater.GatewayPaymentID, payments.GatewaySucceeded)
	if s, err := live.Check(ctx, api, paidLater.ID); err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("the payment after the restore point: %s %v", s.Status, err)
	}
	b.gw.SetStatus(failed.GatewayPaymentID, payments.GatewaySucceeded) // the money came anyway
	gap, err := live.Create(ctx, api, payments.CreateInput{OrderID: "o-gap", Amount: 700, Currency: "EUR"})
	if err != nil || gap.Session.Status != payments.StatusRegistered {
		t.Fatalf("a Create in the gap: %+v %v", gap, err)
	}
	registrations := b.gw.Calls(fakegw.OpRegister)
	var events int
	if err := livePool.QueryRow(ctx, `SELECT count(*) FROM session_events`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	gapFeed, gapCursor := feedAll(t, live, "", payments.MaxFeedRead, events) // the gap's last event is its end

	// The restore: replicas start on the restored database; the gateway is as it is.
	b.clock.Advance(10 * time.Minute)
	restored := testdb.Pool(t, restoredURL)
	svc := b.service(restored, "replica-restored")
	count := func(sql string, args ...any) (n int) {
		t.Helper()
		if err := restored.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if s, err := svc.Get(ctx, paidLater.ID); err != nil || s.Status != payments.StatusRegistered {
		t.Fatalf("restored state: %s %v; want the restore point's Registered", s.Status, err)
	}

	// 1. reconcile --since the restore point (plus margin).
	rep := reconcileSince(t, svc, time.Hour)
	if k := findingKinds(rep); rep.Errors != 0 || k[payments.CaseLatePayment] != 1 || k[payments.FindingDriven] != 1 {
		t.Fatalf("reconcile after the restore: %+v", rep)
	}
	if s, _ := svc.Get(ctx, paidLater.ID); s.Status != payments.StatusCompleted {
		t.Fatalf("the session paid after the restore point is %s, want Completed", s.Status)
	}
	if n := count(`SELECT count(*) FROM accounting_entries WHERE order_id = 'o-paid-later' AND entry_type = 'PaymentReceived'`); n != 1 {
		t.Fatalf("PaymentReceived entries = %d, want 1", n)
	}
	if n := count(`SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment' AND resolved_at IS NULL`, failed.ID); n != 1 {
		t.Fatalf("late_payment cases for the Failed session = %d, want 1", n)
	}
	if n := count(`SELECT count(*) FROM accounting_entries WHERE order_id = 'o-failed'`); n != 0 {
		t.Fatalf("the late payment wrote %d ledger entries; a case, not an effect", n)
	}

	// 4. (the runbook's) A feed reader's cursor from the gap is told (410), though the restored
	// database has events after it by now (reconcile's): read on, it would have skipped the
	// ones before it. A cursor from before the restore point reads on.
	// (An empty page: a transaction of the cluster older than the gap's is still running, so its
	// events may yet come: asked again until the running ones pass it.)
	for deadline := time.Now().Add(60 * time.Second); ; {
		page, err := svc.Feed(ctx, gapCursor, 10)
		if payments.ErrorCode(err) == payments.EEXPIRED {
			break
		}
		if err != nil || len(page.Events) > 0 || time.Now().After(deadline) {
			t.Fatalf("the restored feed after the gap's cursor: %d events, %v; want expired", len(page.Events), err)
		}
	}
	if _, err := svc.Feed(ctx, gapFeed[0].Cursor, 10); err != nil {
		t.Fatalf("the restored feed after a cursor from before the restore point: %v", err)
	}

	// 2. The gap's gateway payment, as its webhook arrives.
	res, err := svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-gap", Type: "payment.updated",
		PaymentID: gap.Session.GatewayPaymentID, Reference: gap.Session.ID})
	if err != nil || res.Outcome != payments.EventUnknownPayment {
		t.Fatalf("the gap's webhook: %+v %v; want unknown_payment", res, err)
	}
	if n := count(`SELECT count(*) FROM webhook_events WHERE outcome = 'unknown_payment' AND gateway_payment_id = $1`, gap.Session.GatewayPaymentID); n != 1 {
		t.Fatalf("the runbook's query finds %d unknown_payment events", n)
	}

	// 3. The shop retries the gap's order: one new session, and the claim holds for its retries.
	again, err := svc.Create(ctx, api, payments.CreateInput{OrderID: "o-gap", Amount: 700, Currency: "EUR"})
	if err != nil || !again.Created || again.Session.ID == gap.Session.ID {
		t.Fatalf("the retried order after the restore: %+v %v; want a new session", again, err)
	}
	for range 3 {
		if r, err := svc.Create(ctx, api, payments.CreateInput{OrderID: "o-gap", Amount: 700, Currency: "EUR"}); err != nil || r.Created || r.Session.ID != again.Session.ID {
			t.Fatalf("a retry of the retried order: %+v %v; want the same session", r, err)
		}
	}
	if n := b.gw.Calls(fakegw.OpRegister) - registrations; n != 1 {
		t.Fatalf("%d registrations after the restore, want 1 (the gap's payment is settled by hand)", n)
	}
}
