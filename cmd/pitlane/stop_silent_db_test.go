package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/internal/testlog"
	"pitlane/payments"
)

// silentProxy forwards TCP to a PostgreSQL server until stall: from then on it forwards no byte in
// either direction and holds every new connection unanswered — a database host that stops
// answering (a network partition, a hung PostgreSQL or pgbouncer host), not one that refuses.
type silentProxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	stalled chan struct{} // closed while forwarding is allowed
	open    bool
	conns   []net.Conn
	// trap (optional): the proxy stalls as a client sends it (before forwarding it), and closes
	// trapped.
	trap     string
	trapped  chan struct{}
	trapOnce sync.Once
}

func newSilentProxy(t *testing.T, target, trap string) *silentProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentProxy{ln: ln, target: target, stalled: make(chan struct{}), open: true, trap: trap, trapped: make(chan struct{})}
	close(p.stalled)
	go p.accept()
	t.Cleanup(func() {
		p.release()
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *silentProxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalled
}

func (p *silentProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		p.stalled = make(chan struct{})
		p.open = false
	}
}

// spring stalls the proxy the first time a client sends the trap's text.
func (p *silentProxy) spring(sent []byte) {
	if p.trap != "" && strings.Contains(string(sent), p.trap) {
		p.trapOnce.Do(func() {
			p.stall()
			close(p.trapped)
		})
	}
}

func (p *silentProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.open {
		close(p.stalled)
		p.open = true
	}
}

func (p *silentProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			<-p.gate()
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn, fromClient bool) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 {
						if fromClient {
							p.spring(buf[:n])
						}
						<-p.gate()
						if _, werr := dst.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				dst.Close()
				src.Close()
			}
			go pipe(s, c, true)
			pipe(c, s, false)
		}()
	}
}

// viaProxy rewrites a database URL to go through the proxy.
func viaProxy(t *testing.T, raw, trap string) (proxied string, p *silentProxy) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p = newSilentProxy(t, u.Host, trap)
	u.Host = p.ln.Addr().String()
	return u.String(), p
}

// silentReplica is a serve whose database goes through a silentProxy (trap: see silentProxy),
// started and seen patrolling. The test's own pool is closed by the caller or at its cleanup.
func silentReplica(t *testing.T, name, trap string) (direct string, proxy *silentProxy, pool *pgxpool.Pool, stop func() error) {
	t.Helper()
	direct = testdb.NewURL(t)
	// default_query_exec_mode=exec, as deploy/pitlane.env.example's DATABASE_URL: every statement's
	// text goes over the wire, so the proxy can tell the patrol's statements.
	// Connections kept open (pool_min_conns), so the patrol's claim finds one when the silence begins.
	proxied, proxy := viaProxy(t, direct+"&default_query_exec_mode=exec&pool_min_conns=12&pool_max_conns=16", trap)
	pcfg, err := pgxpool.ParseConfig(proxied)
	if err != nil {
		t.Fatal(err)
	}
	// No liveness ping before handing out an idle connection (it would be the first thing held,
	// and tell the proxy nothing of who waits): the statements themselves go out.
	pcfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err = pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the proxy is released (a server still waiting can end), then the
	// pool waits for its connections.
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.release)

	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "SECRET_KEY": strings.Repeat("s", 32),
			"GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k", "REPLICA_ID": name,
			"SWEEP_INTERVAL": "50ms"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	var synced <-chan struct{}
	_, stop = startServeWith(t, cfg, pool, slog.New(slog.NewTextHandler(io.Discard, nil)),
		serveOptions{clock: func(c *payments.DatabaseClock) { synced = c.Synced() }})
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		t.Fatal("the database clock was never read")
	}
	return direct, proxy, pool, stop
}

// unitTimeoutStop is deploy/pitlane.service's TimeoutStopSec: systemd SIGKILLs a replica that
// has not stopped by then.
const unitTimeoutStop = 45 * time.Second

// stopWithin sends the stop and fails the test unless serve returns within the unit's timeout.
func stopWithin(t *testing.T, proxy *silentProxy, stop func() error) {
	t.Helper()
	stopped := make(chan error, 1)
	began := time.Now()
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		t.Logf("serve stopped after %s: %v", time.Since(began).Round(time.Millisecond), err)
	case <-time.After(unitTimeoutStop):
		proxy.release() // let it end, so the test leaves nothing behind
		err := <-stopped
		t.Fatalf("SIGTERM while the database does not answer: serve had not stopped after %s (the unit's TimeoutStopSec: systemd SIGKILLs it); it returned only once the database answered again, after %s: %v",
			unitTimeoutStop, time.Since(began).Round(time.Millisecond), err)
	}
}

// A replica stopped while its database does not answer (a network cut, a hung host) must still
// stop within deploy/pitlane.service's TimeoutStopSec. It did not: the patrol's heartbeat ran
// under context.WithoutCancel with no bound, so a round waiting on the silent database held the
// stop until the database answered again, and systemd SIGKILLed the replica (an outside review of
// a replica's life; it failed 3 times in a row there on the code before the fix). The beat is
// now cut a gateway timeout after the stop (patrolRound, claimContext).
func TestStopWhileTheDatabaseIsSilentEndsWithinTheUnitsTimeout(t *testing.T) {
	t.Parallel()
	direct, proxy, _, stop := silentReplica(t, "stop-silent", "")
	watch := testdb.Pool(t, direct)
	// The patrol runs: its heartbeat row is there.
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond) // polling a row the server writes
	defer tick.Stop()
	for {
		var n int
		if err := watch.QueryRow(context.Background(), `SELECT count(*) FROM sweeper_heartbeats WHERE replica_id = 'stop-silent'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the patrol never beat")
		}
		<-tick.C
	}

	// The database stops answering. The patrol's next round (one starts every SWEEP_INTERVAL; in
	// production the stop comes seconds or minutes into an outage) waits on it: seen in this
	// process's stacks on two looks in a row.
	proxy.stall()
	inRound := func() bool {
		buf := make([]byte, 4<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "payments.(*Service).patrolRound(")
	}
	for seen := 0; seen < 2; {
		if time.Now().After(deadline.Add(60 * time.Second)) {
			t.Fatal("the patrol's round never waited on the silent database")
		}
		<-tick.C
		if inRound() {
			seen++
		} else {
			seen = 0
		}
	}
	stopWithin(t, proxy, stop)
}

// Whatever waits on the silent database at the stop, the replica stops within the unit's
// timeout and exits: nothing it would write can be written, and its leases lapse on their own.
// Here the patrol's reconciliation loop is caught in its last write of a run (endRun's UPDATE,
// under context.WithoutCancel with no bound, as several of the patrol's "must be recorded"
// writes are): RunSweeper waits for that loop, so serve waited for it until the database
// answered again, and the pool's Close in runServe waited for its connection after that (a
// fresh-clone CI run caught this class: TestStopWhileTheDatabaseIsSilentEndsWithinTheUnitsTimeout
// failed once after its heartbeat fix). serve now waits for the patrol at most
// patrolStopBoundFor and for the pool at most poolCloseBound.
func TestStopEndsWhileThePatrolWaitsOnTheSilentDatabase(t *testing.T) {
	t.Parallel()
	// The trap is the reconciliation's endRun (the first run is at the patrol's start).
	_, proxy, pool, stop := silentReplica(t, "stop-silent-reconcile", "SET running_until = NULL")
	select {
	case <-proxy.trapped:
	case <-time.After(60 * time.Second):
		t.Fatal("the reconciliation never ended a run")
	}
	stopWithin(t, proxy, stop)

	// runServe's last step: the pool's connection held by the waiting write is not waited for.
	logs := &testlog.Buffer{}
	began := time.Now()
	closed := make(chan bool, 1)
	go func() { closed <- closePool(pool, slog.New(slog.NewTextHandler(logs, nil))) }()
	select {
	case ok := <-closed:
		if ok {
			t.Fatal("the pool closed while the database did not answer: the trap did not hold a connection")
		}
		if !strings.Contains(logs.String(), "exiting without closing them") {
			t.Errorf("the stop did not say it left connections behind: %s", logs.String())
		}
		t.Logf("closePool gave up after %s", time.Since(began).Round(time.Millisecond))
	case <-time.After(poolCloseBound + 10*time.Second):
		proxy.release()
		<-closed
		t.Fatalf("closing the pool waited for the silent database (%s)", time.Since(began).Round(time.Millisecond))
	}
}
