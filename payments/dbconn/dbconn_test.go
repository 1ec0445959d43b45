package dbconn_test

import (
	"context"
	"net"
	neturl "net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/pgbouncer"
	"pitlane/internal/testdb"
	"pitlane/payments/dbconn"
)

// A statement whose context ends stops on the server: here a DELETE waiting on a row lock is
// canceled, and no backend goes on waiting to delete the row once the lock is free. With pgx's
// default (the client's socket closed, nothing said to the server) the backend went on waiting
// and deleted the row after its caller had been told the call failed.
func TestACanceledStatementStopsOnTheServer(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t) // configured as the service's pools are (dbconn.CancelOnContextEnd)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE held (id int PRIMARY KEY); INSERT INTO held VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var holder int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM held WHERE id = 1 FOR UPDATE`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := pool.Exec(cctx, `DELETE FROM held WHERE id = 1`)
		done <- err
	}()
	waiting := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND $1::int = ANY(pg_blocking_pids(pid))`, holder).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(30 * time.Second); waiting() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the DELETE never waited on the held row")
		}
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the canceled DELETE succeeded")
	}
	if n := waiting(); n != 0 {
		t.Fatalf("the canceled DELETE still waits on the server (%d backends): it would delete the row once the lock is free", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM held`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d rows (%v), want the row still there", rows, err)
	}
}

// The same cut through pgbouncer (transaction pooling, as deploy/pgbouncer.ini): the statement
// stops on the server and pgbouncer lives on. pgx's own cancel handler closed the cancel
// connection as soon as the canceled statement returned, before pgbouncer 1.18 had finished
// forwarding it, and pgbouncer exited (`bad client state: 0`) at the first cut: every replica
// lost its database (an outside review).
func TestACutStatementThroughPgbouncerStopsAndPgbouncerLivesOn(t *testing.T) {
	t.Parallel()
	upstream := testdb.NewEmptyURL(t)
	pool := testdb.Pool(t, pgbouncer.Start(t, upstream, 3))
	direct := testdb.Pool(t, upstream)
	ctx := context.Background()
	if _, err := direct.Exec(ctx, `CREATE TABLE held (id int PRIMARY KEY); INSERT INTO held VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	tx, err := direct.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT FROM held WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		// Every other cut inside a transaction, as the core's are (inTx): its ROLLBACK must
		// reach the server through pgbouncer too.
		var q interface {
			Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		} = pool
		var inTx pgx.Tx
		if i%2 == 1 {
			if inTx, err = pool.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			q = inTx
		}
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, cut := q.Exec(cctx, `DELETE FROM held WHERE id = 1`)
		cancel()
		if cut == nil {
			t.Fatal("the DELETE went through a held row")
		}
		if inTx != nil {
			if err := inTx.Rollback(ctx); err != nil {
				t.Fatalf("the ROLLBACK after a cut statement: %v", err)
			}
		}
		if err := pool.Ping(ctx); err != nil {
			t.Fatalf("after %d cut statements (the last: %v) pgbouncer does not answer: %v", i+1, cut, err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM held`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d rows (%v), want the row still there: a cut DELETE went on on the server", rows, err)
	}
}

// A cancel request that arrives after its statement has finished anyway must not cancel the
// connection's next statement: the canceled call returns only once the server has closed the
// cancel connection (it has then signaled the backend, which is idle and ignores it). Without
// that wait about one next statement in six was "canceling statement due to user request".
func TestALateCancelNeverCutsTheConnectionsNextStatement(t *testing.T) {
	t.Parallel()
	pool := testdb.PoolOf(t, testdb.New(t), 1)
	ctx := context.Background()
	cuts, hits := 0, 0
	for i := range 300 {
		// bounds from 1 to 26 ms around a 20 ms statement: some cut, some finished when the
		// cancel arrives
		cctx, cancel := context.WithTimeout(ctx, time.Duration(1000+(i*83)%25000)*time.Microsecond)
		if _, err := pool.Exec(cctx, `SELECT pg_sleep(0.02)`); err != nil {
			cuts++
		}
		cancel()
		if _, err := pool.Exec(ctx, `SELECT pg_sleep(0.001)`); err != nil {
			hits++
			t.Logf("the statement after a cut one: %v", err)
		}
	}
	if hits != 0 || cuts == 0 {
		t.Fatalf("%d of 300 next statements failed (%d statements cut); want none", hits, cuts)
	}
}

// failoverProxy forwards TCP to target until goSilent: from then on the connections open so far
// forward nothing more (what they send is swallowed, nothing comes back, nothing is closed: a
// host gone silent), while new connections are forwarded as before (the failover's new host).
type failoverProxy struct {
	addr   string
	mu     sync.Mutex
	silent chan struct{} // closed when the connections open until then go silent
	close  func()        // every connection closed, the listener too (a pool then closes at once)
}

func newFailoverProxy(t *testing.T, target string) *failoverProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &failoverProxy{addr: ln.Addr().String(), silent: make(chan struct{})}
	var conns []net.Conn
	p.close = func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(p.close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			conns = append(conns, c, s)
			silent := p.silent
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					select {
					case <-silent: // swallowed
					default:
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return p
}

func (p *failoverProxy) goSilent() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.silent)
	p.silent = make(chan struct{})
}

// A pooled connection to a host that went silent (a failover that moved the database's name
// elsewhere and left the old host unanswering) is given up at the pool's ping timeout, and the
// statement runs on a fresh connection: pgxpool pings a connection that sat idle before handing
// it out, and without a ping timeout the ping took the caller's whole deadline (a request's bound,
// 55 s by default) and the caller got nothing. Negative control: without dbconn's PingTimeout
// the query below fails at its 20 s deadline.
func TestAPooledConnectionToASilentHostIsGivenUpAtThePingTimeout(t *testing.T) {
	t.Parallel()
	u, err := neturl.Parse(testdb.NewEmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFailoverProxy(t, u.Host)
	u.Host = proxy.addr
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	dbconn.ConfigurePool(cfg)
	// Two: the given-up connection's slot stays taken while pgx drains it (up to 15 s on a
	// silent host); the pool's other slot gets the fresh one.
	cfg.MaxConns = 2
	// pgxpool pings a connection idle for over a second; here every time, so the test need not
	// let one sit idle.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	defer proxy.close() // first: pgx drains a silent connection up to 15 s at the pool's close
	if err := pool.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	proxy.goSilent()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var one int
	start := time.Now()
	if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatalf("a query after the pool's connection went silent: %v; want it run on a fresh connection", err)
	}
	t.Logf("answered in %v", time.Since(start).Round(time.Millisecond))
}

// A pooled connection whose server ended it while it sat in the pool — pgbouncer restarted or
// told to KILL, PostgreSQL restarted, a backend terminated: FATAL, then the end — is not handed
// out for a statement. pgxpool pings only a connection idle over a second, and the next
// statement on each such connection of a busy pool failed with the FATAL though the database
// answered again (an outside review, pgbouncer: a Create's apply after the gateway registered
// its payment, a keyed request's first INSERT).
func TestAConnectionTheServerEndedIsNotHandedOut(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool, admin := testdb.Pool(t, url), testdb.Pool(t, url)
	ctx := context.Background()
	var held []*pgxpool.Conn
	var pids []int32
	for range 3 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		pids = append(pids, int32(c.Conn().PgConn().PID()))
	}
	for _, c := range held {
		c.Release()
	}
	var ended int
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM unnest($1::int[]) pid`, pids).Scan(&ended); err != nil || ended != len(pids) {
		t.Fatalf("%d of %d backends ended (%v)", ended, len(pids), err)
	}
	for i := range len(pids) + 1 {
		if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
			t.Fatalf("statement %d on a pool whose idle connections the server ended: %v", i, err)
		}
	}
}
