package live

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Run is the replica's one listener: it connects to PostgreSQL directly, LISTENs on Channel and
// publishes every notification to the hub until ctx ends. When the connection drops (a restart,
// a failover, pg_terminate_backend, a network cut seen by TCP keepalive) it tells subscribers
// the stream is down (pages poll meanwhile), reconnects with a doubling backoff, and on the new
// connection tells every subscriber to refresh once: notifications sent while nobody listened
// are lost for good (PostgreSQL queues them only for listening sessions).
//
// With no page open for IdleAfter it closes its connection and rests until a page opens. A
// listening session is not free for the writers: every commit that notifies signals it, and it
// wakes to read the queue and pass each notification on, on every replica, for every payment
// the API touches. With nobody watching, that is work for nobody (docs/performance.md, the
// sixth session). The page that wakes it is told to refresh once it listens again, as after a
// reconnect; meanwhile it is not told Down (the LISTEN is a moment away), and if the LISTEN
// fails it is, like every other page.
func (h *Hub) Run(ctx context.Context) {
	backoff := h.cfg.MinBackoff
	for {
		started := time.Now()
		up, err := h.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRest) {
			h.cfg.Logger.Debug("live: no page open; the listener rests until one opens", "idle_after", h.cfg.IdleAfter)
			backoff = h.cfg.MinBackoff
			for !h.watched() {
				select {
				case <-ctx.Done():
					return
				case <-h.wake:
				}
			}
			continue
		}
		h.setDown() // a resting listener that could not get its connection back is down too
		if up && time.Since(started) >= h.cfg.MaxBackoff {
			backoff = h.cfg.MinBackoff // it lasted: the next drop is news, not a flapping link
		}
		h.cfg.Logger.Warn("live: listener connection lost; pages poll until it is back", "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, h.cfg.MaxBackoff)
	}
}

// setupBound bounds the listener's setup on its new connection (pid, setting, LISTEN).
const setupBound = 10 * time.Second

// listen holds one connection: LISTEN, then publish what arrives. up says whether LISTEN
// succeeded (the hub was up on this connection).
func (h *Hub) listen(ctx context.Context) (up bool, err error) {
	conn, err := h.connect(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// A pooler in transaction mode (pgbouncer) accepts the LISTEN, then hands its server
	// connection to other clients: notifications go astray and the page waits for nothing while
	// the hub says it listens. Such a pooler gives its clients a cancel key of its own, so the
	// backend pid announced at connect is not the one the server reports.
	// The setup's round trips are bounded (setupBound): a LISTEN whose host went silent (a
	// failover that left the old host silent while new connections reach the new primary) held
	// the listener until TCP gave up, the hub down and every page polling though a new
	// connection would listen at once (a review of a silent host).
	sctx, scancel := context.WithTimeout(ctx, setupBound)
	defer scancel()
	var pid uint32
	if err := conn.QueryRow(sctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return false, fmt.Errorf("live: backend pid: %w", err)
	}
	if pid != conn.PgConn().PID() {
		return false, fmt.Errorf("%w (the server's backend pid %d is not the %d announced at connect)", ErrNotDirect, pid, conn.PgConn().PID())
	}
	// The connection idles between notifications by design: an idle_session_timeout set on the
	// database or role (a guard against leaked connections) closed it after every quiet spell,
	// each time a reconnect, pages polling meanwhile and a change in between heard by nobody.
	// A statement, not a startup parameter: pgbouncer refuses unknown ones, and the listener
	// pointed at it must fail as not direct (above), not on its settings.
	if _, err := conn.Exec(sctx, "SET idle_session_timeout = 0"); err != nil {
		return false, fmt.Errorf("live: idle_session_timeout: %w", err)
	}
	if _, err := conn.Exec(sctx, "LISTEN "+Channel); err != nil {
		return false, fmt.Errorf("live: listen: %w", err)
	}
	h.setUp()
	if h.cfg.OnListen != nil {
		h.cfg.OnListen(conn.PgConn().PID())
	}
	h.cfg.Logger.Debug("live: listening", "channel", Channel, "pid", conn.PgConn().PID())
	// The wait for notifications ends with lctx when the hub rests (rested closed first).
	lctx, cancel := context.WithCancel(ctx)
	rested, idleDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(idleDone)
		if h.cfg.IdleAfter > 0 && h.idle(lctx) {
			close(rested)
			cancel()
		}
	}()
	defer func() {
		cancel()
		<-idleDone
		select {
		case <-rested: // the hub rests: nobody to tell
		default:
			h.setDown()
		}
	}()
	for {
		n, err := conn.WaitForNotification(lctx)
		if err != nil {
			select {
			case <-rested:
				return true, errRest
			default:
			}
			return true, fmt.Errorf("live: wait for notification: %w", err)
		}
		ev, err := decode(n.Payload)
		if err != nil {
			h.cfg.Logger.Warn("live: notification ignored", "err", err)
			continue
		}
		h.publish(ev)
	}
}

// ErrNotDirect: the listener's connection goes through a pooler, where a LISTEN does not hold.
// The hub stays down (pages poll; pitlane_live_listener_up is 0) and tries again later.
var ErrNotDirect = errors.New("live: the listener's connection is not direct to PostgreSQL (a pooler such as pgbouncer is in between, where LISTEN does not hold): set LISTEN_DATABASE_URL to a direct URL")

// errRest ends a listen whose hub rests: no page was open for IdleAfter.
var errRest = errors.New("live: no page open")

// idle waits, while the listener listens, until no page has been open for IdleAfter and then
// rests the hub (true); false when ctx ends first. A page that opens and closes again within
// the wait does not restart it: what counts is that none is open when it ends.
func (h *Hub) idle(ctx context.Context) bool {
	for {
		for h.watched() {
			select {
			case <-ctx.Done():
				return false
			case <-h.emptied:
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-h.cfg.Timers.After(h.cfg.IdleAfter):
			if h.rest() {
				return true
			}
		}
	}
}

// connect opens the listener's own connection. TCP keepalive is tightened (30 s idle, then 3
// probes 10 s apart): a listener that only waits would otherwise not notice a silently dead
// peer for hours, and it must not make a query per tick to find out.
func (h *Hub) connect(ctx context.Context) (*pgx.Conn, error) {
	// Parsed as the pool parses it: LISTEN_DATABASE_URL, or DATABASE_URL when unset, may carry
	// the pool's own settings (pool_max_conns, …), which a plain connection would send to
	// PostgreSQL as run-time parameters and have refused — the listener would never listen.
	pc, err := pgxpool.ParseConfig(h.cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("live: listener connection settings: %w", err)
	}
	cfg := pc.ConnConfig
	name := "pitlane live"
	if h.cfg.Name != "" {
		name += " " + h.cfg.Name
	}
	cfg.RuntimeParams["application_name"] = name
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 10 * time.Second, Count: 3}}
	cfg.DialFunc = d.DialContext
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("live: connect listener: %w", err)
	}
	return conn, nil
}
