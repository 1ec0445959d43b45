package payments

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Clock is injected so that every time rule (code expiry, leases, backoff, intent windows) can be
// tested without sleeping. SQL never calls now() for a rule: the service passes Clock.Now() in.
// A server's clock is a DatabaseClock: every replica's times are the database's.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time { return time.Now().UTC() }

// ManualClock is a clock tests move by hand.
type ManualClock struct {
	mu sync.Mutex
	t  time.Time
}

// NewManualClock starts a manual clock at t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{t: t.UTC()} }

func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t.UTC()
	c.mu.Unlock()
}

// DatabaseClock is the database's wall clock, read on the host. Leases, claims, code and link
// expiries and throttle windows are written by one replica and compared by another; each
// replica's times came from its own host, so a host clock 30 s ahead took over leases 30 s early
// and drove a payment beside the replica still holding it. Read through this clock, every
// replica's times are the one database's, whatever its host's clock says (NTP or not).
//
// Sync reads PostgreSQL's clock_timestamp() and anchors it to this process's monotonic clock;
// Now is that reading plus the monotonic time since. So a step of the host's wall clock between
// two syncs (NTP, date -s) moves nothing; what the monotonic clock misses (a suspended VM) and
// what the database's own clock does (a step, a failover) is caught by Run, which syncs again
// every interval and at once when the host's wall and monotonic clocks part. Until the first
// Sync the clock is the host's (Synced says when that ended). A new anchor moves the clock at
// once, as a step of the host's clock would.
type DatabaseClock struct {
	host      func() time.Time // the host's wall clock (tests set it off the true time)
	anchor    atomic.Pointer[clockAnchor]
	firstSync chan struct{} // closed by the first successful Sync
	once      sync.Once
}

// clockAnchor is the database's time read at one instant of this process's monotonic clock.
type clockAnchor struct {
	db   time.Time // the database's clock then
	mono time.Time // time.Now() then: its monotonic reading is what counts
}

// NewDatabaseClock reads the database's time on a host whose wall clock is host (nil: time.Now).
func NewDatabaseClock(host func() time.Time) *DatabaseClock {
	if host == nil {
		host = time.Now
	}
	return &DatabaseClock{host: host, firstSync: make(chan struct{})}
}

// Synced is closed once a Sync has succeeded: a server starts its patrol (which takes and
// compares leases) and answers ready only then, not on its host's clock while the database is
// unreachable.
func (c *DatabaseClock) Synced() <-chan struct{} { return c.firstSync }

func (c *DatabaseClock) Now() time.Time {
	a := c.anchor.Load()
	if a == nil {
		return c.host().UTC()
	}
	return a.db.Add(time.Since(a.mono)).UTC()
}

// HostOffset is the host's wall clock minus the database's, now; ok is false before the first
// Sync (nothing is known then).
func (c *DatabaseClock) HostOffset() (offset time.Duration, ok bool) {
	if c.anchor.Load() == nil {
		return 0, false
	}
	return c.host().Round(0).Sub(c.Now()), true
}

// clockSamples is how many round trips one Sync takes; the shortest bounds the error best.
const clockSamples = 3

// Sync reads the database's clock and anchors it. Each of a few round trips reads
// clock_timestamp() between two monotonic readings: the database read its clock somewhere in
// between, so it belongs to their midpoint within half the round trip. The shortest round trip
// of them is taken, and anchored only when the clock in use reads outside its bounds at that
// midpoint: the clock does not jitter by a round trip's noise, and follows a real move (the
// database's clock stepped, the monotonic clock stopped while the VM slept) at once.
// It returns the host's wall clock minus the database's (what HostOffset says) and the
// measurement's uncertainty (half its round trip).
//
// A pool's reads are timed on one connection held in a transaction for the Sync (BEGIN pins a
// server connection behind pgbouncer too): a read sent to the pool first waits its turn for a
// connection, wholly before the database reads its clock, and a saturated pool put the anchor
// ahead of the database's by half that wait — every lease and expiry this replica judged then
// early by as much (an outside review, clock skew).
func (c *DatabaseClock) Sync(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (hostOffset, uncertainty time.Duration, err error) {
	if p, ok := db.(interface {
		Begin(context.Context) (pgx.Tx, error)
	}); ok {
		tx, err := p.Begin(ctx)
		if err != nil {
			off, _ := c.HostOffset()
			return off, 0, fmt.Errorf("clock: a connection to read the database's clock on: %w", err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		db = tx
	}
	var best clockAnchor
	var bestWall time.Time
	bestRTT := time.Duration(-1)
	for range clockSamples {
		var dbNow time.Time
		mono, wall := time.Now(), c.host().Round(0)
		if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
			off, _ := c.HostOffset()
			return off, 0, fmt.Errorf("clock: read the database's clock: %w", err)
		}
		if rtt := time.Since(mono); bestRTT < 0 || rtt < bestRTT {
			best, bestWall, bestRTT = clockAnchor{db: dbNow, mono: mono.Add(rtt / 2)}, wall.Add(rtt/2), rtt
		}
	}
	half := bestRTT / 2
	adopt := true
	if cur := c.anchor.Load(); cur != nil {
		d := cur.db.Add(best.mono.Sub(cur.mono)).Sub(best.db) // what the clock in use read then, minus the database
		adopt = d > half || d < -half
	}
	if adopt {
		c.anchor.Store(&best)
		c.once.Do(func() { close(c.firstSync) })
	}
	return bestWall.Sub(best.db), half, nil
}

// Run keeps the clock on the database's until ctx ends: it syncs at once, then every interval,
// every second while no Sync has succeeded yet, and at once when the host's wall clock and this
// process's monotonic clock have parted by more than clockReportAfter since the last sync (a
// host clock stepped, a VM that slept). A failure is logged and tried again a second later, the
// anchor in use staying. A host clock more than a second off the database's is logged at the
// first sync, and every move of it by more than clockReportAfter after that.
//
// A Sync lasts an interval per read at most: under ctx alone, a read the database never answered
// (a failover that left the old host silent) held the loop until TCP gave up, and the new
// primary's clock — another host's — was not read for as long. A slow database that answers
// each read within the interval is still read (a replica starting beside a busy database must
// become ready).
func (c *DatabaseClock) Run(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, interval time.Duration, log *slog.Logger) {
	tick := time.NewTicker(min(interval, time.Second))
	defer tick.Stop()
	var lastMono, lastWall time.Time // of the last successful sync
	var reported time.Duration
	var failedAt time.Time // when a failed read was last logged (zero: the last read succeeded)
	leftOut := 0
	for {
		parted := false
		if !lastMono.IsZero() {
			d := c.host().Round(0).Sub(lastWall) - time.Since(lastMono)
			parted = d > clockReportAfter || d < -clockReportAfter
		}
		if lastMono.IsZero() || parted || time.Since(lastMono) >= interval {
			sctx, cancel := context.WithTimeout(ctx, clockSamples*interval)
			off, _, err := c.Sync(sctx, db)
			cancel()
			switch {
			case err != nil:
				// Tried again every second: while the database is away, said once a minute
				// (every second was 3,600 lines an hour: a review).
				if ctx.Err() == nil && (failedAt.IsZero() || time.Since(failedAt) >= outageLogEvery) {
					log.Warn("clock: could not read the database's clock; trying again (logged once a minute while it fails)", "err", err, "left_out", leftOut)
					failedAt, leftOut = time.Now(), 0
				} else {
					leftOut++
				}
			case lastMono.IsZero():
				if off > time.Second || off < -time.Second {
					log.Warn("clock: this host's clock is off the database's; pitlane's times follow the database's", "host_offset", off)
				}
				reported = off
			case off-reported > clockReportAfter || reported-off > clockReportAfter:
				log.Warn("clock: this host's clock moved against the database's; pitlane's times follow the database's", "host_offset", off)
				reported = off
			}
			if err == nil {
				lastMono, lastWall = time.Now(), c.host().Round(0)
				failedAt, leftOut = time.Time{}, 0
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// clockReportAfter: an offset change smaller than this is not logged.
const clockReportAfter = 100 * time.Millisecond
