package dbconn_test

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments/dbconn"
)

// stallConn is a TCP connection (its SyscallConn promoted, so serverSpoke peeks at it) whose
// armed write returns only once pgx's background reader (started by pgx's 15 ms slow-write
// timer) has read the whole answer and entered its next Read: a writer goroutine descheduled
// for more than 15 ms on a loaded host, or a large batch whose answer arrives while it is written.
type stallConn struct {
	*net.TCPConn
	mu       sync.Mutex
	armed    bool
	sawReady bool
	again    chan struct{} // closed when a Read begins after the answer's ReadyForQuery
	once     sync.Once
}

func (c *stallConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.armed && c.sawReady {
		c.once.Do(func() { close(c.again) })
	}
	c.mu.Unlock()
	n, err := c.TCPConn.Read(p)
	c.mu.Lock()
	if c.armed && bytes.Contains(p[:n], []byte{'Z', 0, 0, 0, 5}) {
		c.sawReady = true
	}
	c.mu.Unlock()
	return n, err
}

func (c *stallConn) Write(p []byte) (int, error) {
	n, err := c.TCPConn.Write(p)
	c.mu.Lock()
	armed := c.armed
	c.mu.Unlock()
	if armed {
		select {
		case <-c.again:
		case <-time.After(10 * time.Second):
		}
	}
	return n, err
}

// A pooled connection handed back while pgx's stopped background reader still sits in a
// Read (it read the whole answer before the writer told it to stop) is the next Acquire's within
// a second: ShouldPing's peek (raw.Read) waits for the socket's read lock, which that Read holds
// until the server says something — on an idle connection, never: the Acquire hung, deaf to its
// context (a review of e35dfc1). The peek runs under Control, which takes no lock.
func TestAnAcquireIsNotHeldByAStoppedBackgroundRead(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	dbconn.ConfigurePool(cfg)
	var conns []*stallConn
	var mu sync.Mutex
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc := &stallConn{TCPConn: c.(*net.TCPConn), again: make(chan struct{})}
		mu.Lock()
		conns = append(conns, sc)
		mu.Unlock()
		return sc, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	sc := conns[0]
	mu.Unlock()
	sc.mu.Lock()
	sc.armed = true
	sc.mu.Unlock()
	if _, err := pool.Exec(ctx, `SELECT 1`, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sc.again:
	default:
		t.Fatal("setup: the background reader did not read ahead")
	}
	sc.mu.Lock()
	sc.armed = false
	sc.mu.Unlock()

	done := make(chan error, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := pool.Exec(actx, `SELECT 1`)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the next statement: %v", err)
		}
	case <-time.After(15 * time.Second):
		sc.TCPConn.Close() // lets the stuck Acquire (and the pool's Close) go
		t.Fatal("the next Acquire (the connection idle under a second) hangs in ShouldPing's peek, past its 2 s context")
	}
}
