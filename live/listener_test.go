package live_test

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"pitlane/internal/pgbouncer"
	"pitlane/internal/testdb"
	"pitlane/live"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The listener against a real PostgreSQL: the triggers of 00330_live.sql NOTIFY, the hub's one
// connection LISTENs and fans out.

type bench struct {
	url       string
	hub       *live.Hub
	listening chan uint32 // the listener's backend pid after each LISTEN
}

func newBench(t *testing.T, mod ...func(*live.Config)) *bench {
	t.Helper()
	return newBenchOn(t, testdb.NewURL(t), mod...)
}

// newBenchOn is newBench on a database the test has prepared.
func newBenchOn(t *testing.T, url string, mod ...func(*live.Config)) *bench {
	t.Helper()
	b := &bench{url: url, listening: make(chan uint32, 10)}
	cfg := live.Config{ConnString: b.url, Name: "test", Logger: slog.New(slog.DiscardHandler), MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		OnListen: func(pid uint32) { b.listening <- pid }}
	for _, m := range mod {
		m(&cfg)
	}
	b.hub = live.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		b.hub.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	return b
}

func (b *bench) listener(t *testing.T) uint32 {
	t.Helper()
	select {
	case pid := <-b.listening:
		return pid
	case <-time.After(30 * time.Second):
		t.Fatal("the listener never listened")
		return 0
	}
}

func (b *bench) subscribe(t *testing.T, topic live.Topic) *live.Subscription {
	t.Helper()
	s, err := b.hub.Subscribe(topic, b.hub.Position().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// until reads a subscription's news until ok says it is what the test waits for.
func until(t *testing.T, s *live.Subscription, what string, ok func(live.Pending) bool) live.Pending {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		p, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok(p) {
			return p
		}
	}
}

// TestTransitionNotifiesItsPages: a Check that takes a payment Registered → Completed reaches the
// payment's page (the session's new status, with its order), the payments list and the ledger
// page (its PaymentReceived entry), and not the page of another payment. An UPDATE that changes
// nothing notifies nobody.
func TestTransitionNotifiesItsPages(t *testing.T) {
	b := newBench(t)
	b.listener(t)
	pool := testdb.Pool(t, b.url)
	gw := fakegw.New()
	svc := payments.NewService(pool, payments.Config{Gateway: gw, CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	ctx := context.Background()
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	mk := func(order string) payments.Session {
		res, err := svc.Create(ctx, shop, payments.CreateInput{OrderID: order, Amount: 1999, Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		return res.Session
	}
	list := b.subscribe(t, live.Topic{Page: live.PagePayments})
	s, other := mk("o-live-1"), mk("o-live-2")
	// Notifications arrive in commit order: once the list heard the second payment registered,
	// everything of the first was heard too.
	until(t, list, "the creates", func(p live.Pending) bool { return p.Last.Session == other.ID && p.Last.Status == "Registered" })
	page := b.subscribe(t, live.Topic{Page: live.PagePayment, Session: s.ID})
	otherPage := b.subscribe(t, live.Topic{Page: live.PagePayment, Session: other.ID})
	ledger := b.subscribe(t, live.Topic{Page: live.PageLedger})
	locks := b.subscribe(t, live.Topic{Page: live.PageLocks})

	gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := svc.Check(ctx, shop, s.ID); err != nil {
		t.Fatal(err)
	}
	// The page hears the gateway call, then the transition and its ledger entry (one commit).
	until(t, page, "the payment's ledger entry", func(p live.Pending) bool { return p.Last.Kind == live.KindLedger && p.Last.Session == s.ID })
	until(t, list, "the list's Completed", func(p live.Pending) bool {
		return p.Last.Kind == live.KindSession && p.Last.Session == s.ID && p.Last.Order == "o-live-1" && p.Last.Status == "Completed"
	})
	until(t, ledger, "the ledger entry", func(p live.Pending) bool { return p.Last.Kind == live.KindLedger && p.Last.Session == s.ID })

	// A rewrite that changes nothing is not news; a marker after it (notifications arrive in
	// commit order) proves the listener has read past it.
	if _, err := pool.Exec(ctx, `UPDATE payment_sessions SET status = status WHERE id = $1`, s.ID); err != nil {
		t.Fatal(err)
	}
	locks.TryNext()
	if _, err := pool.Exec(ctx, `SELECT pg_notify('pitlane_live', '{"k":"ledger","id":"marker"}')`); err != nil {
		t.Fatal(err)
	}
	until(t, ledger, "the marker", func(p live.Pending) bool { return p.Last.Session == "marker" })
	if p, ok := otherPage.TryNext(); ok {
		t.Fatalf("another payment's page heard %+v", p)
	}
	if p, ok := locks.TryNext(); ok {
		t.Fatalf("an UPDATE that changed nothing was news: %+v", p)
	}
}

// TestListenerReconnects: the listener's connection is terminated (as a failover or an admin
// would); subscribers are told to refresh once it listens again on a new connection, a page
// rendered before the drop refreshes when it subscribes, and later changes arrive.
func TestListenerReconnects(t *testing.T) {
	b := newBench(t)
	first := b.listener(t)
	pool := testdb.Pool(t, b.url)
	ctx := context.Background()
	list := b.subscribe(t, live.Topic{Page: live.PagePayments})
	before := b.hub.Position().String()

	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, first); err != nil {
		t.Fatal(err)
	}
	second := b.listener(t)
	if second == first {
		t.Fatalf("listening on the terminated backend %d again", first)
	}
	until(t, list, "a refresh after the reconnect", func(p live.Pending) bool { return p.Refresh && !p.Down })

	late, err := b.hub.Subscribe(live.Topic{Page: live.PagePayments}, before)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if p, ok := late.TryNext(); !ok || !p.Refresh {
		t.Fatalf("a page rendered before the drop subscribed after it: %+v %v, want a refresh", p, ok)
	}

	if _, err := pool.Exec(ctx, `SELECT pg_notify('pitlane_live', '{"k":"session","id":"after","s":"Registered"}')`); err != nil {
		t.Fatal(err)
	}
	until(t, list, "a change after the reconnect", func(p live.Pending) bool { return p.Last.Session == "after" })
}

// A database (or role) with idle_session_timeout set — a common guard against leaked
// connections — closed the listener's connection whenever no change came for that long: it
// idles between notifications by design. Each time the hub went down and pages polled until it
// listened again, and a change in between reached no stream. The listener's connection turns
// the timeout off for itself. Negative control: without the run-time parameter the backend is
// gone once it has idled past the timeout.
func TestListenerOutlivesIdleSessionTimeout(t *testing.T) {
	url := testdb.NewURL(t)
	pool := testdb.Pool(t, url)
	ctx := context.Background()
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET idle_session_timeout = '50ms'`); err != nil {
		t.Fatal(err)
	}
	b := newBenchOn(t, url)
	pid := b.listener(t)
	// Wait, by the database's clock, until the listener has idled four times the timeout, or
	// its backend is gone.
	for {
		var idle, alive bool
		if err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(state = 'idle' AND now() - state_change > interval '200ms'), false), count(*) > 0
			FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&idle, &alive); err != nil {
			t.Fatal(err)
		}
		if !alive {
			t.Fatalf("the listener's backend %d was closed by idle_session_timeout", pid)
		}
		if idle {
			break
		}
	}
	list := b.subscribe(t, live.Topic{Page: live.PagePayments})
	if _, err := pool.Exec(ctx, `SELECT pg_notify('pitlane_live', '{"k":"session","id":"later","s":"Registered"}')`); err != nil {
		t.Fatal(err)
	}
	until(t, list, "a change after the idle spell", func(p live.Pending) bool { return p.Last.Session == "later" })
	select {
	case again := <-b.listening:
		t.Fatalf("the listener listened again (backend %d after %d)", again, pid)
	default:
	}
}

// TestSlowSubscriberDoesNotBlockOthers: 5 000 notifications in one burst while one subscriber
// never looks: the other hears every one of them (the listener never waited), and the slow one
// finds them folded into one count when it finally looks.
func TestSlowSubscriberDoesNotBlockOthers(t *testing.T) {
	b := newBench(t)
	b.listener(t)
	pool := testdb.Pool(t, b.url)
	slow := b.subscribe(t, live.Topic{Page: live.PagePayments})
	fast := b.subscribe(t, live.Topic{Page: live.PagePayments})
	if _, err := pool.Exec(context.Background(), `SELECT pg_notify('pitlane_live', json_build_object('k', 'session', 'id', 's-' || i)::text)
		FROM generate_series(1, 5000) i`); err != nil {
		t.Fatal(err)
	}
	heard := 0
	until(t, fast, "the whole burst", func(p live.Pending) bool {
		heard += p.Changes
		return p.Last.Session == "s-5000"
	})
	if heard != 5000 {
		t.Fatalf("the fast subscriber heard %d changes, want 5000", heard)
	}
	p, ok := slow.TryNext()
	if !ok || p.Changes != 5000 || p.Last.Session != "s-5000" {
		t.Fatalf("the slow subscriber found %+v (%v), want 5000 changes folded", p, ok)
	}
}

// TestLiveBehindPgbouncer: the deployment's shape. Replicas write through pgbouncer in
// transaction mode (the triggers' NOTIFY goes out at each commit, whatever server connection ran
// it), the listener connects directly (LISTEN_DATABASE_URL): a Create and a Check through
// pgbouncer reach the page.
func TestLiveBehindPgbouncer(t *testing.T) {
	b := newBench(t)
	b.listener(t)
	through := pgbouncer.Start(t, b.url, 2)
	gw := fakegw.New()
	svc := payments.NewService(testdb.Pool(t, through), payments.Config{Gateway: gw, CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	ctx := context.Background()
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	list := b.subscribe(t, live.Topic{Page: live.PagePayments})
	res, err := svc.Create(ctx, shop, payments.CreateInput{OrderID: "o-bounced", Amount: 1999, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	until(t, list, "the create through pgbouncer", func(p live.Pending) bool { return p.Last.Session == res.Session.ID && p.Last.Status == "Registered" })
	gw.SetStatus(res.Session.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := svc.Check(ctx, shop, res.Session.ID); err != nil {
		t.Fatal(err)
	}
	until(t, list, "the check through pgbouncer", func(p live.Pending) bool { return p.Last.Session == res.Session.ID && p.Last.Status == "Completed" })
}

// TestListenerRefusesAPooledConnection: with the listener's URL through pgbouncer in transaction
// mode (LISTEN_DATABASE_URL left unset behind pgbouncer), a LISTEN is accepted and then lost
// with its server connection. The listener must see it is not on a direct connection and stay
// down (pages poll, the alert can fire) instead of saying it listens (audit 6).
func TestListenerRefusesAPooledConnection(t *testing.T) {
	refused := make(chan string, 10)
	b := newBench(t, func(c *live.Config) {
		c.ConnString = pgbouncer.Start(t, c.ConnString, 2)
		c.Logger = slog.New(recordHandler{func(r slog.Record) {
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "err" && strings.Contains(a.Value.String(), "not direct") {
					select {
					case refused <- a.Value.String():
					default:
					}
				}
				return true
			})
		}})
	})
	sub := b.subscribe(t, live.Topic{Page: live.PagePayments})
	for range 2 { // the first attempt and a retry
		select {
		case <-refused:
		case pid := <-b.listening:
			t.Fatalf("the listener listens through pgbouncer (backend %d)", pid)
		case <-time.After(30 * time.Second):
			t.Fatal("the listener never tried")
		}
	}
	if b.hub.Up() || b.hub.Listening() {
		t.Fatalf("through pgbouncer: Up %v, Listening %v; want down", b.hub.Up(), b.hub.Listening())
	}
	if p, ok := sub.TryNext(); ok && !p.Down {
		t.Fatalf("the page was told %+v, want down (poll)", p)
	}
}

// recordHandler hands every log record to f.
type recordHandler struct{ f func(slog.Record) }

func (h recordHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error { h.f(r); return nil }
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h recordHandler) WithGroup(string) slog.Handler                 { return h }

// TestPatrolHeartbeatsNotifyTheDashboard: a replica's patrol row reaches the dashboard when it
// arrives, when its sessions in flight change and when it leaves, but not when it only beats
// (every round): that would be polling by another name.
func TestPatrolHeartbeatsNotifyTheDashboard(t *testing.T) {
	b := newBench(t)
	b.listener(t)
	pool := testdb.Pool(t, b.url)
	ctx := context.Background()
	dash := b.subscribe(t, live.Topic{Page: live.PageDashboard})
	ledger := b.subscribe(t, live.Topic{Page: live.PageLedger}) // for markers
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// marker proves the listener has read past everything committed before it.
	marker := func(id string) {
		t.Helper()
		exec(`SELECT pg_notify('pitlane_live', '{"k":"ledger","id":"` + id + `"}')`)
		until(t, ledger, "marker "+id, func(p live.Pending) bool { return p.Last.Session == id })
	}

	exec(`INSERT INTO sweeper_heartbeats (replica_id, concurrency, started_at, beat_at) VALUES ('r-1', 4, now(), now())`)
	until(t, dash, "the new replica", func(p live.Pending) bool { return p.Last.Kind == live.KindPatrol && p.Last.Session == "r-1" })
	exec(`UPDATE sweeper_heartbeats SET beat_at = now() + interval '2 seconds' WHERE replica_id = 'r-1'`)
	marker("after-beat")
	if p, ok := dash.TryNext(); ok {
		t.Fatalf("a beat alone reached the dashboard: %+v", p)
	}
	exec(`UPDATE sweeper_heartbeats SET in_flight = 3, last_sweep_at = now() WHERE replica_id = 'r-1'`)
	until(t, dash, "sessions in flight", func(p live.Pending) bool { return p.Last.Kind == live.KindPatrol })
	exec(`DELETE FROM sweeper_heartbeats WHERE replica_id = 'r-1'`)
	until(t, dash, "the replica leaving", func(p live.Pending) bool { return p.Last.Kind == live.KindPatrol && p.Last.Session == "r-1" })
}

// TestListenerRestsWithNoPageOpen: with no page open for IdleAfter the listener closes its
// connection (no backend LISTENs, so a commit that notifies signals nobody) and the hub still
// reports itself well. A page opening wakes it; that page is not told Down, and is told to
// refresh once the listener listens again, so a payment created while it rested is not lost to
// it; later changes reach it. Control: the same idle wait with a page open closes nothing.
func TestListenerRestsWithNoPageOpen(t *testing.T) {
	timers := live.NewManualTimers(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	b := newBench(t, func(c *live.Config) { c.Timers, c.IdleAfter = timers, time.Minute })
	b.listener(t)
	pool := testdb.Pool(t, b.url)
	ctx := context.Background()
	listeners := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'pitlane live test' AND datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// eventually waits (no sleep: it yields and asks again) until cond holds.
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s", what)
			}
			runtime.Gosched()
		}
	}
	armed := func() bool { return timers.Armed() == 1 }

	// Control: the idle timer armed at start fires while a page is open.
	eventually("the idle timer armed at start", armed)
	page := b.subscribe(t, live.Topic{Page: live.PagePayments})
	timers.Advance(time.Minute)
	if n := listeners(); n != 1 || !b.hub.Listening() {
		t.Fatalf("with a page open: %d listening backends (hub listening: %v), want 1", n, b.hub.Listening())
	}
	if p, ok := page.TryNext(); ok {
		t.Fatalf("the open page was told %+v", p)
	}

	// The last page closes; a minute later the connection is gone.
	page.Close()
	eventually("the idle timer armed when the last page closed", armed)
	timers.Advance(time.Minute)
	eventually("the listener's connection closed", func() bool { return listeners() == 0 })
	if !b.hub.Up() || b.hub.Listening() {
		t.Fatalf("resting: Up %v, Listening %v; want up (well) and not listening", b.hub.Up(), b.hub.Listening())
	}
	before := b.hub.Position().String()
	svc := payments.NewService(pool, payments.Config{Gateway: fakegw.New(), CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	shop := payments.Actor{Kind: payments.ActorAPI, ID: "shop"}
	if _, err := svc.Create(ctx, shop, payments.CreateInput{OrderID: "o-rested", Amount: 1999, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}

	// A page rendered now (its position taken while resting) opens: the listener wakes.
	late, err := b.hub.Subscribe(live.Topic{Page: live.PagePayments}, before)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	b.listener(t)
	p := until(t, late, "a refresh once the listener is back", func(p live.Pending) bool { return p.Refresh || p.Down })
	if p.Down {
		t.Fatalf("the page that woke the listener was told Down: %+v", p)
	}
	if n := listeners(); n != 1 {
		t.Fatalf("awake: %d listening backends, want 1", n)
	}
	res, err := svc.Create(ctx, shop, payments.CreateInput{OrderID: "o-awake", Amount: 1999, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	until(t, late, "a change after the wake", func(p live.Pending) bool { return p.Last.Session == res.Session.ID })
}
