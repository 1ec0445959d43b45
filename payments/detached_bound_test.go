package payments_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
)

// notifyFunc is a Notifier made of a function.
type notifyFunc func(ctx context.Context, m payments.Message) error

func (f notifyFunc) Notify(ctx context.Context, m payments.Message) error { return f(ctx, m) }

// answeredWithinAMinute runs do while the test holds its service's only connection (handed over
// on heldc once taken) and returns what do returns. A do still waiting after a minute — as long
// as the database does not answer — fails the test as what, once the connection is given back
// and do has ended.
func answeredWithinAMinute[T any](t *testing.T, heldc chan *pgxpool.Conn, what string, do func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- do() }()
	select {
	case v := <-done:
		return v
	case <-time.After(time.Minute):
		(<-heldc).Release()
		<-done
		t.Fatalf("%s waited a minute for a database that did not answer", what)
		var zero T
		return zero
	}
}

// The writes that must be made though their request or round ended — here a cancel code's
// outbox row given back when the request that sent it was cut mid-delivery — wait for a database
// that does not answer by payments.RecordGrace at most. Under context.WithoutCancel alone the
// give-back waited as long as the database did, and so did the request (a stop of the replica
// too). The database "does not answer" as in TestAuditOutlivesItsRequestByItsGraceAtMost: the
// only connection of the service's pool is taken. Negative control: with the give-back under
// context.WithoutCancel again, the request is still waiting after a minute.
func TestADeliveryCutByItsRequestGivesTheRowBackWithinTheGrace(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	one := testdb.PoolOf(t, b.pool, 1)
	req, cut := context.WithCancel(context.Background())
	defer cut()
	heldc := make(chan *pgxpool.Conn, 1) // the connection the notifier took
	svc := b.service(one, "replica-one", func(c *payments.Config) {
		c.Notifier = notifyFunc(func(ctx context.Context, m payments.Message) error {
			held, err := one.Acquire(context.Background())
			if err != nil {
				return err
			}
			heldc <- held
			cut() // the client hangs up while the message is on its way
			return ctx.Err()
		})
	})
	sess := b.registered(t, "o-detached-bound", 100)
	answeredWithinAMinute(t, heldc, "the request (the give-back of its message)", func() error {
		_, err := svc.RequestCancel(req, api, sess.ID)
		return err
	})
	select {
	case held := <-heldc:
		held.Release()
	default:
		t.Fatal("the code was never handed to the notifier")
	}
	// The row was not given back (the database did not answer): it stays the writer's until its
	// lease ends, then the patrol's — the code is not lost.
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND lease_until IS NOT NULL`); n != 1 {
		t.Fatalf("%d undelivered leased messages, want the code", n)
	}
}

// silentOnceAsked is a service of b on a pool of one connection whose gateway takes that
// connection when first asked about a payment (statusAfter; the connection comes out of heldc):
// from then on the service's database does not answer. With mod's settings.
func silentOnceAsked(t *testing.T, b *bench, mod func(*payments.Config)) (*payments.Service, chan *pgxpool.Conn) {
	t.Helper()
	one := testdb.PoolOf(t, b.pool, 1)
	heldc := make(chan *pgxpool.Conn, 1)
	return b.service(one, "replica-one", func(c *payments.Config) {
		c.Gateway = &statusAfter{Gateway: b.gw, before: func() {
			held, err := one.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			heldc <- held
		}}
		mod(c)
	}), heldc
}

// A gateway's delivery of an event is applied though the gateway hangs up, but not for longer
// than the claim it takes on the event (LeaseDuration), and its record then waits RecordGrace at
// most: here the database stops answering while the event is applied (the pool's only
// connection is taken during the gateway call). The delivery is answered (queued) and the event
// stays unprocessed under its claim, for the patrol once the claim runs out. Under
// context.WithoutCancel alone, the delivery waited as long as the database did (negative
// control: still waiting after a minute).
func TestAGatewayDeliveryWaitsForASilentDatabaseNoLongerThanItsClaim(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	svc, heldc := silentOnceAsked(t, b, func(c *payments.Config) { c.LeaseDuration = time.Second })
	sess := b.registered(t, "o-silent-hook", 100)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	type answer struct {
		res payments.EventResult
		err error
	}
	got := answeredWithinAMinute(t, heldc, "the delivery", func() answer {
		res, err := svc.HandleGatewayEvent(context.Background(), payments.GatewayEvent{ID: "evt-silent",
			Type: "payment.updated", PaymentID: sess.GatewayPaymentID, Reference: sess.ID})
		return answer{res, err}
	})
	(<-heldc).Release()
	if got.err != nil || got.res.Outcome != payments.EventQueued {
		t.Fatalf("the delivery: %+v %v; want it queued for the patrol", got.res, got.err)
	}
	if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt-silent' AND processed_at IS NULL
		AND claim_token IS NOT NULL`); n != 1 {
		t.Fatal("the event is not left unprocessed under its claim")
	}
}

// A patrol drive whose database stops answering once the gateway has spoken (the pool's only
// connection is taken during the gateway call) gives up its record, and the round its release
// and its beat, each within a lease: the row stays leased, for the patrol once the lease runs out, and the
// patrol goes on. Under context.WithoutCancel alone the round waited as long as the database did
// (after a failover that left the old host silent, until TCP gave up: about 15 minutes), and the
// replica's patrol stood still meanwhile. Negative control: still waiting after a minute.
func TestAPatrolRoundWaitsForASilentDatabaseNoLongerThanALease(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	svc, heldc := silentOnceAsked(t, b, func(c *payments.Config) { c.LeaseDuration, c.GatewayTimeout = 2*time.Second, time.Second })
	sess := b.registered(t, "o-silent-patrol", 100)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	b.clock.Advance(time.Hour)
	answeredWithinAMinute(t, heldc, "the patrol round", func() error {
		_, err := svc.PatrolRound(context.Background())
		return err
	})
	(<-heldc).Release()
	if got, err := b.svc.Get(t.Context(), sess.ID); err != nil || got.Status == payments.StatusCompleted {
		t.Fatalf("the payment: %v %v; want its answer not recorded (the database did not answer)", got.Status, err)
	}
}

// A reconciliation run lasts no longer than its leadership without a renewal (the leader row's
// TTL, past which another replica may run): here the database stops answering while the run
// compares a session (the pool's only connection is taken during its gateway status call). The
// run ends the leader TTL after its take, its records RecordGrace after that, and it says why.
// Under the patrol's own context alone, the run — and the replica's reconciliation loop — waited
// as long as the database did (negative control: still waiting after a minute).
func TestAReconcileRunWaitsForASilentDatabaseNoLongerThanItsLeadership(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	svc, heldc := silentOnceAsked(t, b, func(*payments.Config) {})
	sess := b.registered(t, "o-silent-reconcile", 100)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	err := answeredWithinAMinute(t, heldc, "the reconciliation run", func() error {
		_, err := svc.ReconcileOnceWith(context.Background(), payments.ReconcileConfig{LeaderTTL: 3 * time.Second})
		return err
	})
	select {
	case held := <-heldc:
		held.Release()
	default:
		t.Fatalf("the run ended (%v) before it asked the gateway", err)
	}
	if err == nil || !strings.Contains(err.Error(), "outlived its lease") {
		t.Fatalf("the run: %v; want it stopped as past its leadership", err)
	}
	if got, err := b.svc.Get(t.Context(), sess.ID); err != nil || got.Status == payments.StatusCompleted {
		t.Fatalf("the payment: %v %v; want the gateway's answer not recorded (the database did not answer)", got.Status, err)
	}
}

// The upkeep loop's housekeeping and sample wait for a silent database a lease (at least 5 s) at
// most, and housekeeping cut so runs again at the next pass: here the pool's only
// connection is taken before the patrol starts, with a dead cancel code in clear in the outbox.
// Once the database answers again, the next pass redacts it. Under the loop's context alone the
// first pass waited as long as the database did (negative control: still waiting after a
// minute); with a cut housekeeping counted as done, the code stayed in clear until the next
// HousekeepingEvery (negative control: not redacted after the next pass).
func TestAnUpkeepPassWaitsForASilentDatabaseNoLongerThanALease(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	b.exec(t, `INSERT INTO outbox (kind, to_addr, body, redacted_body, created_at)
		VALUES ('cancel_code', 'ana@example.com', 'your code is 424242', 'your code is ••••••', $1)`, t0.Add(-time.Hour))
	one := testdb.PoolOf(t, b.pool, 1)
	passed := make(chan struct{}, 100)
	svc := b.service(one, "replica-one", func(c *payments.Config) {
		c.LeaseDuration, c.SideLoopEvery = time.Second, 10*time.Millisecond
		c.Hooks.AfterUpkeep = func(context.Context) { passed <- struct{}{} }
	})
	held, err := one.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	heldc := make(chan *pgxpool.Conn, 1)
	heldc <- held
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.RunSweeper(ctx, time.Hour); close(done) }()
	defer func() { cancel(); mustWait(t, done, "the patrol to stop") }()
	answeredWithinAMinute(t, heldc, "the upkeep pass", func() struct{} { <-passed; return struct{}{} })
	(<-heldc).Release()
	for len(passed) > 0 { // passes that may have started before the release
		<-passed
	}
	mustWait(t, passed, "an upkeep pass after the database answers again")
	mustWait(t, passed, "a second one")
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE body LIKE '%424242%'`); n != 0 {
		t.Fatal("the dead code is still in clear after the database answered again; want the cut housekeeping run again")
	}
}
