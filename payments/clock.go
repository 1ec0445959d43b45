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

// DatabaseClock is the database's wall clock, read on the host: the host's clock corrected by
// how far it is from PostgreSQL's clock_timestamp(). Leases, claims, code and link expiries
// and throttle windows are written by one replica and compared by another; each replica's
// times come from its own host, so a host clock 30 s ahead would take over leases 30 s early
// and drive a payment beside the replica still holding it. Read through this clock, every
// replica's times are the one database's, whatever its host's clock says (NTP or not).
//
// Sync measures the offset; Run keeps measuring it. Until the first Sync the clock is the
// host's. A change of the offset moves the clock at once, as a step of the host's clock would.
type DatabaseClock struct {
	host      func() time.Time
	offset    atomic.Int64 // the host's clock minus the database's, in nanoseconds
	synced    atomic.Bool
	firstSync chan struct{} // closed by the first successful Sync
	once      sync.Once
}

// NewDatabaseClock reads the database's time on a host whose clock is host (nil: time.Now).
func NewDatabaseClock(host func() time.Time) *DatabaseClock {
	if host == nil {
		host = time.Now
	}
	return &DatabaseClock{host: host, firstSync: make(chan struct{})}
}

// Synced is closed once a Sync has succeeded: a server starts its patrol (which takes and
// compares leases) only then, not on its host's clock while the database is unreachable.
func (c *DatabaseClock) Synced() <-chan struct{} { return c.firstSync }

func (c *DatabaseClock) Now() time.Time {
	return c.host().UTC().Add(-time.Duration(c.offset.Load()))
}

// HostOffset is the host's clock minus the database's, as last adopted (0 before the first Sync).
func (c *DatabaseClock) HostOffset() time.Duration { return time.Duration(c.offset.Load()) }

// clockSamples is how many round trips one Sync takes; the shortest bounds the error best.
const clockSamples = 3

// Sync measures the host's offset from the database and adopts it. Each of a few round trips
// reads clock_timestamp() and takes the host's clock before and after: the database read its
// clock somewhere in between, so the host's midpoint minus the database's time is the offset
// within half the round trip. The round trip shortest of them is taken, and adopted only when
// the offset in use lies outside its bounds: the clock does not jitter by a round trip's noise,
// and follows a real step (a host clock set, a drift accumulated) at the next Sync.
// It returns the offset in use and the measurement's uncertainty (half its round trip).
func (c *DatabaseClock) Sync(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (offset, uncertainty time.Duration, err error) {
	best, bestRTT := time.Duration(0), time.Duration(-1)
	for range clockSamples {
		var dbNow time.Time
		before := c.host()
		if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
			return c.HostOffset(), 0, fmt.Errorf("clock: read the database's clock: %w", err)
		}
		rtt := c.host().Sub(before)
		if bestRTT < 0 || rtt < bestRTT {
			best, bestRTT = before.Add(rtt/2).Sub(dbNow), rtt
		}
	}
	half := bestRTT / 2
	if cur := c.HostOffset(); !c.synced.Load() || cur < best-half || cur > best+half {
		c.offset.Store(int64(best))
		c.synced.Store(true)
		c.once.Do(func() { close(c.firstSync) })
	}
	return c.HostOffset(), half, nil
}

// Run syncs every interval until ctx ends (every second while no Sync has succeeded yet; a
// failure is logged and tried again, the last offset staying in use) and logs each offset it
// adopts that differs from the one reported before by more than clockReportAfter.
func (c *DatabaseClock) Run(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, interval time.Duration, log *slog.Logger) {
	reported := c.HostOffset()
	t := time.NewTimer(c.nextSync(interval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		off, _, err := c.Sync(ctx, db)
		t.Reset(c.nextSync(interval))
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("clock: could not read the database's clock; keeping the last offset", "err", err, "host_offset", c.HostOffset())
			}
			continue
		}
		if d := off - reported; d > clockReportAfter || d < -clockReportAfter {
			log.Warn("clock: this host's clock moved against the database's; pitlane's times follow the database's", "host_offset", off)
			reported = off
		}
	}
}

func (c *DatabaseClock) nextSync(interval time.Duration) time.Duration {
	if !c.synced.Load() {
		return min(interval, time.Second)
	}
	return interval
}

// clockReportAfter: an offset change smaller than this is not logged.
const clockReportAfter = 100 * time.Millisecond
