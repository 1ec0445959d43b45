package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
)

// TestEveryEntryPointRunsOnAPoolOfOneConnection: the core's entry points, one after another, on a
// replica whose pool has one connection (pool_max_conns=1 in DATABASE_URL, a setting the docs
// name). A transaction that, while it holds its connection, sends a statement through the pool
// instead of through itself waits for a second connection that never comes: on this pool it
// hangs until its deadline (or until lock_timeout fails whoever waits behind it), and on any pool
// under load it holds one connection idle while queueing for another. CachedStats did that with
// its counts (an outside review: every /metrics scrape of such a replica answered
// pitlane_stats_up 0); this is the check that the rest does not. A new entry point belongs here.
//
// Negative control: with CachedStats counting through s.Stats(ctx) again (the code before), the
// CachedStats step fails, "hung on a pool of one connection", after its deadline.
func TestEveryEntryPointRunsOnAPoolOfOneConnection(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	svc := b.service(testdb.PoolOf(t, b.pool, 1), "one")
	step := func(name string, f func(ctx context.Context) error) {
		t.Helper()
		// Far beyond what any step takes on an idle database (the whole list runs in about a
		// second), and below the bench's lock_timeout, so a wait for a second connection shows as
		// a hang, not as a lock error.
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		start := time.Now()
		err := f(ctx)
		if ctx.Err() != nil {
			t.Errorf("%s: hung on a pool of one connection (%v after %s)", name, err, time.Since(start).Round(time.Millisecond))
		} else if err != nil {
			// Each step's preconditions are set up by the steps before it, so every one succeeds:
			// an error is what the one connection did (say, lock_timeout ending a wait behind a
			// lock this replica's own transaction holds while it queues for a connection).
			t.Errorf("%s on a pool of one connection: %v", name, err)
		}
	}
	var sess payments.Session
	step("Create", func(ctx context.Context) error {
		r, err := svc.Create(ctx, api, payments.CreateInput{OrderID: "one-1", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
		sess = r.Session
		return err
	})
	step("Create again", func(ctx context.Context) error {
		_, err := svc.Create(ctx, api, payments.CreateInput{OrderID: "one-1", Amount: 1000, Currency: "EUR"})
		return err
	})
	step("Check", func(ctx context.Context) error { _, err := svc.Check(ctx, api, sess.ID); return err })
	step("CachedStats", func(ctx context.Context) error { _, err := svc.CachedStats(ctx, 5*time.Second); return err })
	step("Stats", func(ctx context.Context) error { _, err := svc.Stats(ctx); return err })
	step("Dashboard", func(ctx context.Context) error { _, err := svc.Dashboard(ctx); return err })
	step("PaymentDetail", func(ctx context.Context) error { _, err := svc.PaymentDetail(ctx, sess.ID); return err })
	step("OpsCharts", func(ctx context.Context) error { _, err := svc.OpsCharts(ctx); return err })
	step("SampleOps", func(ctx context.Context) error { _, err := svc.SampleOps(ctx); return err })
	step("Leases", func(ctx context.Context) error { _, err := svc.Leases(ctx); return err })
	step("AdvisoryLocks", func(ctx context.Context) error { _, err := svc.AdvisoryLocks(ctx); return err })
	step("StuckSessions", func(ctx context.Context) error { _, err := svc.StuckSessions(ctx, payments.StuckFilter{}); return err })
	step("Feed", func(ctx context.Context) error { _, err := svc.Feed(ctx, "", 10); return err })
	step("PushEvents", func(ctx context.Context) error { _, err := svc.PushEvents(ctx); return err })
	step("DeliverOutbox", func(ctx context.Context) error { _, err := svc.DeliverOutbox(ctx); return err })
	step("ReconcileOnce", func(ctx context.Context) error { _, err := svc.ReconcileOnce(ctx); return err })
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	b.clock.Advance(time.Hour)
	step("PatrolRound", func(ctx context.Context) error { _, err := svc.PatrolRound(ctx); return err })
	step("Check settle", func(ctx context.Context) error { _, err := svc.Check(ctx, api, sess.ID); return err })
	step("CreateRefund", func(ctx context.Context) error {
		_, err := svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: sess.ID, Amount: 100, RequestKey: "r1"})
		return err
	})
	step("DriveRefunds", func(ctx context.Context) error { _, err := svc.DriveRefunds(ctx); return err })
	var s2 payments.Session
	step("Create 2", func(ctx context.Context) error {
		r, err := svc.Create(ctx, api, payments.CreateInput{OrderID: "one-2", Amount: 10, Currency: "EUR", CustomerContact: "c@example.com"})
		s2 = r.Session
		return err
	})
	var ch payments.Challenge
	step("RequestCancel", func(ctx context.Context) error {
		var err error
		ch, err = svc.RequestCancel(ctx, api, s2.ID)
		return err
	})
	step("ConfirmCancel", func(ctx context.Context) error {
		_, err := svc.ConfirmCancel(ctx, api, s2.ID, ch.ID, b.lastCode(t, s2.ID))
		return err
	})
	step("HandleGatewayEvent", func(ctx context.Context) error {
		_, err := svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-1", Type: "payment.updated", PaymentID: sess.GatewayPaymentID, Reference: sess.Reference()})
		return err
	})
	step("RetryWebhooksOnce", func(ctx context.Context) error { _, err := svc.RetryWebhooksOnce(ctx); return err })
	step("CheckoutPay", func(ctx context.Context) error {
		_, err := svc.CheckoutPay(ctx, "11111111-1111-4111-8111-111111111111", payments.CreateInput{OrderID: "one-3", Amount: 10, Currency: "EUR"}, 0)
		return err
	})
	step("ReapIdempotencyKeys", func(ctx context.Context) error {
		_, err := svc.ReapIdempotencyKeys(ctx, b.clock.Now(), 100)
		return err
	})
}
