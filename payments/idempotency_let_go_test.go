package payments_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
)

// cutConns records the connections that sent Acquire's INSERT so the test can cut them, and
// loses every cancel request (pgbouncer restarted, or dropped it).
type cutConns struct {
	mu      sync.Mutex
	hits    []net.Conn
	cancels int
}

type recConn struct {
	net.Conn
	c *cutConns
}

func (r *recConn) Write(p []byte) (int, error) {
	// A cancel request (length 16, code 80877102) that never reaches the server: pgbouncer
	// restarted (it no longer knows the key) or dropped it (a client it had queued).
	if len(p) == 16 && bytes.Equal(p[:8], []byte{0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e}) {
		r.c.mu.Lock()
		r.c.cancels++
		r.c.mu.Unlock()
		r.Conn.Close()
		return len(p), nil
	}
	if bytes.Contains(p, []byte("INSERT INTO idempotency_keys")) {
		r.c.mu.Lock()
		r.c.hits = append(r.c.hits, r.Conn)
		r.c.mu.Unlock()
	}
	return r.Conn.Write(p)
}

func (c *cutConns) cut() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.hits {
		n.Close()
	}
	return len(c.hits)
}

// Acquire's autocommit INSERT is sent and its connection breaks while the server still runs it
// (it waits on a lock) and the cancel request is lost (pgbouncer restarted, or dropped it): the
// request answers 503 and lets go of its key in the background. The INSERT has not committed
// yet, so Abandon finds no row under the token; read as "nothing left to write", the goroutine
// stopped, the INSERT then committed, and the same request was refused 409 until the stale
// bound (a review). It tries again until the stale bound. Negative control (run by hand): no
// row found read as the end, the second Acquire is refused busy.
func TestAnInsertStillRunningWhenItsKeyIsLetGoOfIsLetGoOfToo(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	cc := &cutConns{}
	pool := poolWrapping(t, b, func(c net.Conn) net.Conn { return &recConn{Conn: c, c: cc} })
	svc := b.service(pool, "replica-cut")
	letGo, tried := make(chan error, 4), make(chan error, 64)
	x := payments.NewIdempotency(svc, payments.IdempotencyConfig{Hooks: payments.IdempotencyHooks{
		AfterLetGo:    func(_, _ string, err error) { letGo <- err },
		AfterLetGoTry: func(_, _ string, err error) { tried <- err },
	}})
	r := idemReq(cl.ID, "k-cut", `{"amount":1}`)

	ctx := context.Background()
	holder, holderPID := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM api_clients WHERE id = $1 FOR UPDATE`, cl.ID); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { _, err := x.Acquire(ctx, r); first <- err }()
	waitBlockedBy(t, b.pool, holderPID) // the INSERT's row is written, it waits for the client row
	if n := cc.cut(); n == 0 {
		t.Fatal("no connection sent the INSERT")
	}
	if err := mustWait(t, first, "first acquire"); err == nil {
		t.Fatal("first acquire succeeded over a cut connection")
	} else {
		t.Logf("first acquire: %v (code %s)", err, payments.ErrorCode(err))
	}
	if err := mustWait(t, tried, "the let-go's first try"); !errors.Is(err, payments.ErrIdempotencyLockLost) {
		t.Fatalf("the let-go's first try = %v, want nothing found under its token (the INSERT still runs)", err)
	}
	if err := holder.Commit(ctx); err != nil { // the lock the orphaned INSERT waits on goes: it commits
		t.Fatal(err)
	}
	if err := mustWait(t, letGo, "background let-go"); err != nil {
		t.Fatalf("let-go: %v", err)
	}
	// The same request again (its INSERT waits for the orphan's transaction, then reads the row).
	s, err := x.Acquire(ctx, r)
	var held int
	_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = 'k-cut' AND lock_token IS NOT NULL`).Scan(&held)
	if err != nil || s.Token == "" {
		t.Fatalf("the same request after its first answered 503: %v (code %s); rows still held: %d — the key is held until the stale bound", err, payments.ErrorCode(err), held)
	}
}

// The database refuses connections (an outage): each Acquire fails before its INSERT was ever
// sent, and each started a background Abandon retrying until the stale bound — a goroutine and
// a pool waiter per failed request, without a cap (a review). A statement that provably never
// ran lets go of nothing, and at most maxLetGo keys are let go of at once. Negative control (run
// by hand): every failure let go of, a goroutine each.
func TestAnAcquireNeverSentLetsGoOfNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	cfg := b.pool.Config().Copy()
	var mu sync.Mutex
	down := true
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dn := down
		mu.Unlock()
		if dn {
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
		}
		return d.DialContext(ctx, network, addr)
	}
	cfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc := b.service(pool, "replica-down")
	x := payments.NewIdempotency(svc, payments.IdempotencyConfig{})
	const n = 200
	for i := range n {
		_, err := x.Acquire(context.Background(), idemReq(cl.ID, fmt.Sprintf("k-down-%d", i), `{"amount":1}`))
		if err == nil {
			t.Fatal("acquire with the database down succeeded")
		}
	}
	// Counted by the slots taken (before each goroutine starts): the goroutines a failed dial
	// leaves for a moment made a count of goroutines flaky (CI, in exec mode).
	if started := payments.LettingGo(svc); started != 0 {
		t.Fatalf("%d background let-gos (each living up to StaleAfter) for %d Acquires whose INSERT was never sent", started, n)
	}
}

// An Acquire of a key that exists (the locked path) whose connection is lost before its
// transaction's COMMIT went out took nothing: nothing is let go of in the background. It held
// one of the background's slots until the stale bound, finding nothing (a re-read: whether the
// COMMIT was sent was not asked).
func TestAnAcquireCutBeforeItsCommitLetsGoOfNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	svc := b.service(b.pool, "replica-cut")
	cut := false
	terminated := 0
	x := payments.NewIdempotency(svc, payments.IdempotencyConfig{Hooks: payments.IdempotencyHooks{
		AfterAcquireRead: func(ctx context.Context, key string) {
			if !cut {
				return
			}
			// The transaction's connection ends between its read and its take-over (a
			// failover, pgbouncer restarted): its next statement fails with FATAL 57P01.
			if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
				FROM (SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'
					AND query LIKE '%FROM idempotency_keys%' OFFSET 0) acquiring`).Scan(&terminated); err != nil {
				t.Error(err)
			}
		},
	}})
	r := idemReq(cl.ID, "k-cut", `{"amount":1}`)
	first, err := x.Acquire(context.Background(), r)
	if err != nil || !first.Fresh {
		t.Fatalf("first acquire: %+v, %v", first, err)
	}
	b.clock.Advance(time.Hour) // its request died: the key is stale, the same request takes it over
	cut = true
	if _, err := x.Acquire(context.Background(), r); err == nil {
		t.Fatal("an acquire whose connection was cut before its COMMIT succeeded")
	}
	if terminated != 1 {
		t.Fatalf("%d transactions cut, want the acquire's one", terminated)
	}
	var holder string
	if err := b.pool.QueryRow(context.Background(), `SELECT lock_token::text FROM idempotency_keys WHERE key = 'k-cut'`).Scan(&holder); err != nil || holder != first.Token {
		t.Fatalf("the key is held by %q (%v), want the first request's token still: nothing was committed", holder, err)
	}
	if n := payments.LettingGo(svc); n != 0 {
		t.Fatalf("%d background let-gos (each living up to StaleAfter) for an acquire whose COMMIT was never sent", n)
	}
}

// commitLoser loses the answer to the first COMMIT read after arm (the server committed; the
// client sees a reset), as handlers' ackDropper does.
type commitLoser struct {
	mu      sync.Mutex
	armed   bool
	dropped int
}

type loseConn struct {
	net.Conn
	l *commitLoser
}

var commitAnswer = []byte{'C', 0, 0, 0, 11, 'C', 'O', 'M', 'M', 'I', 'T', 0}
var readyAnswer = []byte{'Z', 0, 0, 0, 5}

func (c *loseConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if !c.l.armed || !bytes.Contains(p[:n], commitAnswer) {
		return n, err
	}
	buf := append([]byte(nil), p[:n]...)
	for !bytes.Contains(buf[bytes.Index(buf, commitAnswer):], readyAnswer) {
		tmp := make([]byte, 8192)
		m, rerr := c.Conn.Read(tmp)
		buf = append(buf, tmp[:m]...)
		if rerr != nil {
			break
		}
	}
	c.l.armed = false
	c.l.dropped++
	c.Conn.Close()
	return 0, syscall.ECONNRESET
}

// An Acquire on the locked path that found the key held by another live request (busy: it took
// nothing under its own token) and whose COMMIT answer was lost started a background Abandon,
// retried until StaleAfter, holding one of the 256 let-go slots though nothing was taken under
// its token; a replay of a completed key alike. A storm of 409 retries during a failover filled
// the slots, and then real let-gos were refused (a review of 7b6c5ee).
func TestABusyAcquireWhoseCommitAnswerWasLostLetsGoOfNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cl := newClient(t, b, "shop")
	l := &commitLoser{}
	pool := poolWrapping(t, b, func(c net.Conn) net.Conn { return &loseConn{Conn: c, l: l} })
	svcA := b.service(b.pool, "replica-a")
	svcB := b.service(pool, "replica-b")
	xa := payments.NewIdempotency(svcA, payments.IdempotencyConfig{})
	xb := payments.NewIdempotency(svcB, payments.IdempotencyConfig{})
	r := idemReq(cl.ID, "k-busy-lost", `{"amount":1}`)
	ctx := context.Background()
	first, err := xa.Acquire(ctx, r)
	if err != nil || !first.Fresh {
		t.Fatalf("first acquire: %+v %v", first, err)
	}
	l.mu.Lock()
	l.armed = true
	l.mu.Unlock()
	_, err = xb.Acquire(ctx, r) // the same request again while the first runs: busy
	if l.dropped != 1 {
		t.Fatalf("no COMMIT answer dropped (err %v)", err)
	}
	if err == nil {
		t.Fatal("acquire whose COMMIT answer was lost succeeded")
	}
	if n := payments.LettingGo(svcB); n != 0 {
		t.Fatalf("%d background let-go(s) holding a slot up to StaleAfter for an acquire that took nothing under its token (busy)", n)
	}
}

// poolWrapping is a pool over b's database whose every connection wrap wraps (what a test makes
// its network do: cut, lose an answer), closed when the test ends.
func poolWrapping(t *testing.T, b *bench, wrap func(net.Conn) net.Conn) *pgxpool.Pool {
	t.Helper()
	cfg := b.pool.Config().Copy()
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(c), nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
