package payments_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
)

// commitStaller wraps a pool's connections: once armed, the first connection that sends a
// COMMIT gets its answer held back (the server has committed; the answer is on the wire) until
// released, or until the client gives up on it by setting a deadline (what pgx does when the
// query's context ends).
type commitStaller struct {
	mu      sync.Mutex
	armed   bool
	stalled chan struct{} // closed when a COMMIT's answer is held
	release chan struct{}
	cut     chan struct{} // closed when the client set a deadline on the held read
}

func newCommitStaller() *commitStaller {
	return &commitStaller{stalled: make(chan struct{}), release: make(chan struct{}), cut: make(chan struct{})}
}

func (s *commitStaller) arm() { s.mu.Lock(); s.armed = true; s.mu.Unlock() }

type stallConn struct {
	net.Conn
	s        *commitStaller
	mu       sync.Mutex
	holding  bool
	deadline chan struct{} // closed at the next SetDeadline/SetReadDeadline
}

func (s *commitStaller) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, s: s, deadline: make(chan struct{})}, nil
}

func (c *stallConn) Write(p []byte) (int, error) {
	// COMMIT, not the READ COMMITTED of the transaction's BEGIN.
	if bytes.Contains(bytes.ReplaceAll(bytes.ToLower(p), []byte("committed"), nil), []byte("commit")) {
		c.s.mu.Lock()
		if c.s.armed {
			c.s.armed = false
			c.mu.Lock()
			c.holding = true
			c.mu.Unlock()
		}
		c.s.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *stallConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	holding, deadline := c.holding, c.deadline
	c.mu.Unlock()
	if holding {
		close(c.s.stalled)
		select {
		case <-c.s.release:
			c.mu.Lock()
			c.holding = false
			c.mu.Unlock()
		case <-deadline:
			c.mu.Lock()
			c.holding = false
			c.mu.Unlock()
			close(c.s.cut)
			return 0, os.ErrDeadlineExceeded
		}
	}
	return c.Conn.Read(p)
}

func (c *stallConn) setDeadline(t time.Time) {
	if t.IsZero() {
		return
	}
	c.mu.Lock()
	close(c.deadline)
	c.deadline = make(chan struct{})
	c.mu.Unlock()
}

func (c *stallConn) SetDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *stallConn) SetReadDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

// A stop that lands while the patrol's claim waits for its COMMIT's answer: the claim has leased
// the rows in the database, and cut there it never returned them — no drive, and the rows waited
// out their lease (six gateway timeouts: a one-time code past its use, a session unlooked at).
// A claim now runs to its end whatever the stop, and its drives, started under the stopped
// round, give the rows back at once; another replica's next round sends the code, once.
// Outside review (crashes); fails with the claim under the round's context.
func TestAStopDuringTheClaimsCommitLeavesNoRowLeased(t *testing.T) {
	t.Parallel()
	n := &stopCutNotifier{parking: true, arrived: make(chan struct{}, 4)}
	b, mod, sess := newCodeBench(t, n, "o-claim-cut")
	ctx := context.Background()
	n.set(true, false) // the request's own delivery fails: the message is the patrol's
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(10 * time.Minute)

	st := newCommitStaller()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = st.dial
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	replica := b.service(pool, "replica-a2", mod)
	n.set(false, true) // a delivery that starts now parks until its context ends

	st.arm()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := replica.DeliverOutbox(rctx); done <- err }()
	mustWait(t, st.stalled, "the claim's COMMIT answer held")
	leased := func() int {
		return b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND lease_until > $2`, sess.ID, b.clock.Now())
	}
	for leased() == 0 { // the server has committed the claim; its answer is held
	}
	cancel() // SIGTERM
	// pgx gives up on a read at once when the query's context ends (it sets a deadline). A claim
	// that runs on after the stop sets none: a second is far beyond the goroutine switch that
	// would take, and then the answer arrives.
	select {
	case <-st.cut:
	case <-time.After(time.Second):
	}
	close(st.release)
	<-done

	if l := leased(); l != 0 {
		t.Errorf("after the stop %d outbox row(s) stay leased with no drive: nothing sends the code until the lease runs out", l)
	}
	n.set(false, false)
	other := b.service(b.pool, "replica-b", mod)
	if _, err := other.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.delivered(); got != 1 {
		t.Fatalf("the cancel code was delivered %d times by the next replica's round, want 1", got)
	}
	if a := b.count(t, `SELECT attempts FROM outbox WHERE payment_id = $1`, sess.ID); a != 2 {
		t.Errorf("attempts = %d, want 2 (the request's failed try, the delivery): the stop's cut is not a try", a)
	}
}

// The other side of a claim the stop does not cut: one that waits behind a table lock (a
// migration's, an operator's) would hold the stop for as long as the lock is held. A claim still
// running a gateway timeout after the stop is cut then.
func TestAStopDoesNotWaitForAClaimStuckBehindALock(t *testing.T) {
	t.Parallel()
	n := &stopCutNotifier{arrived: make(chan struct{}, 4)}
	b := newBench(t, func(c *payments.Config) {
		c.Notifier = n
		c.GatewayTimeout = 200 * time.Millisecond
		c.LockTimeout = time.Hour // the lock wait is not what ends it
	})
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := b.svc.DeliverOutbox(rctx); done <- err }()
	waitLockWaiters(t, b.pool, 1) // the claim waits for the table
	cancel()                      // SIGTERM
	mustWait(t, done, "the round to end while the table stays locked")
}
