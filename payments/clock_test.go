package payments_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// hostClock is a host's clock as it is, set off the true time by skew.
type hostClock time.Duration

func (c hostClock) Now() time.Time { return time.Now().UTC().Add(time.Duration(c)) }

// A host whose clock is an hour ahead still reads the database's time once synced.
func TestDatabaseClockReadsTheDatabasesTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.NewURL(t))
	clock := payments.NewDatabaseClock(hostClock(time.Hour).Now)
	if _, ok := clock.HostOffset(); ok {
		t.Fatal("an offset known before the first sync")
	}
	if d := time.Until(clock.Now()); d < 59*time.Minute {
		t.Fatalf("before the first sync the clock reads %v from the true time, want the host's (an hour ahead)", d)
	}
	for range 2 { // the second sync keeps (or refines) the first's offset
		off, within, err := clock.Sync(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if d := off - time.Hour; d > time.Second || d < -time.Second || within > time.Second {
			t.Fatalf("host offset %v within %v, want an hour", off, within)
		}
	}
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if d := clock.Now().Sub(dbNow); d > time.Second || d < -time.Second {
		t.Fatalf("the clock reads %v from the database's time, want the database's", d)
	}
}

// queuedPool is a pool whose every statement sent to it waits its turn for a connection first (a
// saturated pgxpool, pgbouncer's client queue in transaction mode): the wait comes before the
// database reads its clock, never after. A transaction holds its connection: no wait.
type queuedPool struct {
	*pgxpool.Pool
	wait time.Duration
}

func (q queuedPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	time.Sleep(q.wait) // latency injected: the queue's wait, not a wait for an event
	return q.Pool.QueryRow(ctx, sql, args...)
}

// A replica that reads the database's clock while its pool's statements queue for a connection
// still reads the database's time: the reads are timed on one connection. Sent to the pool, a
// 2 s queue before each read put the clock a second ahead of the database's (Sync takes the
// read at the round trip's midpoint), every lease and expiry this replica judged a second early
// (an outside review, clock skew). Negative control: with Sync reading through the pool, 1 s.
func TestDatabaseClockIsNotMovedByAQueueForAConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.NewURL(t))
	clock := payments.NewDatabaseClock(nil)
	if _, _, err := clock.Sync(ctx, queuedPool{Pool: pool, wait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if d := clock.Now().Sub(dbNow); d > 500*time.Millisecond || d < -500*time.Millisecond {
		t.Fatalf("after a sync behind a 2 s queue the clock reads %v from the database's time, want within 500 ms", d)
	}
}

// steppingHost is a host's wall clock that an administrator (or NTP) may step at any moment.
type steppingHost struct{ skew atomic.Int64 }

func (h *steppingHost) Now() time.Time { return time.Now().UTC().Add(time.Duration(h.skew.Load())) }

// A step of the host's wall clock after the sync moves nothing: the clock is the database's
// reading plus this process's monotonic time since. (With the offset subtracted from the host's
// wall clock, as first written, it moved by the whole step until the next sync.) What the host's
// wall clock says now is reported as its offset.
func TestDatabaseClockIgnoresAStepOfTheHostsClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t, testdb.NewURL(t))
	host := &steppingHost{}
	clock := payments.NewDatabaseClock(host.Now)
	if _, _, err := clock.Sync(ctx, pool); err != nil {
		t.Fatal(err)
	}
	host.skew.Store(int64(10 * time.Minute)) // the host's clock is set ten minutes ahead
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if d := clock.Now().Sub(dbNow); d > time.Second || d < -time.Second {
		t.Fatalf("after the host's step the clock reads %v from the database's time, want the database's", d)
	}
	if off, ok := clock.HostOffset(); !ok || off < 9*time.Minute || off > 11*time.Minute {
		t.Fatalf("host offset %v %v, want the step (ten minutes)", off, ok)
	}
}

// Replica B's host clock runs ten minutes ahead. While replica A's registration is on its way to
// the gateway, B's patrol must leave the session alone: A's lease and the registration's grace
// are A's times, compared with B's. On its host's clock B sees them long past and drives the
// session beside A (the negative control); on the database's clock it sees what A sees.
func TestAReplicaWhoseHostClockRunsAheadDoesNotTakeLeases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		synced  bool
		drivesB bool
	}{{"database clock", true, false}, {"host clock (negative control)", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clockA := payments.NewDatabaseClock(nil)
			ahead := hostClock(10 * time.Minute)
			var clockB payments.Clock = ahead
			var other *payments.Service
			driven := -1
			b := newBench(t, func(c *payments.Config) {
				c.Clock = clockA
				c.Hooks.BeforeRegister = func(ctx context.Context, id string) {
					n, err := other.SweepOnce(ctx)
					if err != nil {
						t.Error(err)
					}
					driven = n
				}
			})
			if tc.synced {
				dc := payments.NewDatabaseClock(ahead.Now)
				if _, _, err := dc.Sync(ctx, b.pool); err != nil {
					t.Fatal(err)
				}
				clockB = dc
			}
			if _, _, err := clockA.Sync(ctx, b.pool); err != nil {
				t.Fatal(err)
			}
			other = b.service(testdb.Pool(t, b.url), "replica-b", func(c *payments.Config) { c.Clock = clockB })
			res, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-clock-ahead", Amount: 1000, Currency: "EUR"})
			if err != nil {
				t.Fatal(err)
			}
			if driven < 0 {
				t.Fatal("the registration never reached the gateway")
			}
			if got := driven > 0; got != tc.drivesB {
				t.Fatalf("replica B drove %d sessions while A's registration was in flight (want any: %v)", driven, tc.drivesB)
			}
			if !tc.drivesB {
				if res.Session.Status != payments.StatusRegistered || b.gw.Calls(fakegw.OpRegister) != 1 {
					t.Fatalf("status %s after %d registrations, want Registered after one", res.Session.Status, b.gw.Calls(fakegw.OpRegister))
				}
			}
		})
	}
}

// Synced is closed by the first successful Sync, not before: a server starts its patrol only
// then (serve), never on its host's clock while the database cannot be read.
func TestDatabaseClockSyncedAfterTheFirstSync(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := payments.NewDatabaseClock(hostClock(time.Hour).Now)
	select {
	case <-clock.Synced():
		t.Fatal("synced before any Sync")
	default:
	}
	down := testdb.Pool(t, testdb.NewURL(t))
	down.Close() // a database that cannot be read
	if _, _, err := clock.Sync(ctx, down); err == nil {
		t.Fatal("Sync over a closed pool succeeded")
	}
	select {
	case <-clock.Synced():
		t.Fatal("synced by a failed Sync")
	default:
	}
	if _, _, err := clock.Sync(ctx, testdb.Pool(t, testdb.NewURL(t))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-clock.Synced():
	default:
		t.Fatal("not synced after a Sync")
	}
}

// failingOver is a database that fails over to a host whose clock is an hour ahead, leaving the
// read on the old host unanswered: the first read after the failover waits until its context
// ends (as pgx gives up a silent connection), every later one reads the new host's clock.
type failingOver struct {
	pool   *pgxpool.Pool
	over   atomic.Bool
	silent atomic.Bool // the read caught on the old host is still to come
}

func (f *failingOver) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !f.over.Load() {
		return f.pool.QueryRow(ctx, sql, args...)
	}
	if f.silent.CompareAndSwap(true, false) {
		<-ctx.Done()
		return f.pool.QueryRow(ctx, sql, args...) // fails: its context ended
	}
	return f.pool.QueryRow(ctx, `SELECT clock_timestamp() + interval '1 hour'`)
}

// messages is a slog.Handler that hands each record's message over.
type messages chan string

func (m messages) Enabled(context.Context, slog.Level) bool { return true }
func (m messages) Handle(_ context.Context, r slog.Record) error {
	select {
	case m <- r.Message:
	default:
	}
	return nil
}
func (m messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m messages) WithGroup(string) slog.Handler      { return m }

// A read of the database's clock caught on a host that went silent lasts one sync interval at
// most: the failover's new clock is read at the next try. Under Run's context alone the loop
// waited as long as the old host did not answer (negative control: the clock still reads the
// old host's time after a minute).
func TestDatabaseClockReadsTheNewPrimaryThoughTheOldOneWentSilent(t *testing.T) {
	t.Parallel()
	db := &failingOver{pool: testdb.Pool(t, testdb.NewURL(t))}
	clock := payments.NewDatabaseClock(nil)
	logged := make(messages, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { clock.Run(ctx, db, 500*time.Millisecond, slog.New(logged)); close(done) }()
	defer func() { cancel(); <-done }()
	mustWait(t, clock.Synced(), "the first read of the database's clock")
	db.silent.Store(true)
	db.over.Store(true)
	for moved := false; !moved; {
		select {
		case m := <-logged:
			moved = strings.Contains(m, "moved against the database's")
		case <-time.After(time.Minute):
			t.Fatal("a minute after the failover the clock still reads the old host's time")
		}
	}
	if d := time.Until(clock.Now()); d < 59*time.Minute {
		t.Fatalf("the clock reads %v from the host's time, want the new primary's (an hour ahead)", d)
	}
}
