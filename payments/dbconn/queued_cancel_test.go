package dbconn_test

import (
	"context"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/pgbouncer"
	"pitlane/internal/testdb"
	"pitlane/payments/dbconn"
)

// closeSignal is a net.Conn that reports its Close.
type closeSignal struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeSignal) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// A statement cut while it waits in pgbouncer's queue for a server connection (the pool is
// busy: default_pool_size taken) was not stopped. pgbouncer 1.18 drops a
// cancel request for a client that is not linked to a server ("cancel request for idle client",
// src/objects.c accept_cancel_request), the cancel connection closes at once, and the statement
// stays queued. When a server connection frees up within cancelGrace the statement starts; it
// waits on a row lock past the grace, pgx then drops its socket, and the backend (whose client
// is pgbouncer) goes on waiting and deletes the row once the lock is free: after its caller was
// told the call failed. The promise (docs/operations.md, dbconn.CancelOnContextEnd): a statement
// whose request ends is canceled on the server, through pgbouncer too. A statement that ran into
// its deadline on a host that took its cancel gets a second one (HandleUnwatchAfterCancel). From
// an outside review; negative control: without the second cancel (fails when the DELETE starts
// within the grace, as it does on a machine that is not loaded).
func TestACutStatementQueuedInPgbouncerStopsToo(t *testing.T) {
	upstream := testdb.NewEmptyURL(t)
	ctx := context.Background()
	through := pgbouncer.Start(t, upstream, 1) // one server connection: a second client queues
	direct := testdb.Pool(t, upstream)
	if _, err := direct.Exec(ctx, `CREATE TABLE held (id int PRIMARY KEY); INSERT INTO held VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	// The row lock the DELETE will wait on (held on PostgreSQL directly).
	holder, err := direct.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	var holderPID int
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid() FROM held WHERE id = 1 FOR UPDATE`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}

	// The replica under test: a pool configured as the service's (dbconn), one connection, whose
	// dials after the first (the cancel requests) report when they close.
	cfg, err := pgxpool.ParseConfig(through)
	if err != nil {
		t.Fatal(err)
	}
	dbconn.ConfigurePool(cfg)
	cfg.MaxConns = 1
	var mu sync.Mutex
	var dials int
	cancelClosed := make(chan struct{})
	lateCancel := make(chan struct{})
	var lateOnce sync.Once
	releaseLate := func() { lateOnce.Do(func() { close(lateCancel) }) }
	defer releaseLate()
	d := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		dials++
		if dials == 2 { // the cancel request of dbconn's handler
			return &closeSignal{Conn: c, closed: cancelClosed}, nil
		}
		if dl, ok := ctx.Deadline(); dials > 2 && ok && time.Until(dl) > 5*time.Second {
			// pgx's own last cancel (15 s bound), sent by the connection's asyncClose when the
			// caller already has its error: it arrives when it arrives (a TLS handshake, a busy
			// pgbouncer, a loaded host); here, after the lock holder has finished.
			mu.Unlock()
			<-lateCancel
			mu.Lock()
		}
		return c, nil
	}
	replica, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	if err := replica.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	// Another client of pgbouncer takes its one server connection (a transaction in progress).
	other, err := pgx.Connect(ctx, through)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	otherTx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otherTx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}

	// pgbouncer's console (auth_type any: every user is admin there).
	au, _ := neturl.Parse(through)
	au.Path = "/pgbouncer"
	q := au.Query()
	q.Set("default_query_exec_mode", "simple_protocol")
	au.RawQuery = q.Encode()
	admin, err := pgx.Connect(ctx, au.String())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	waitingClients := func() int {
		rows, err := admin.Query(ctx, `SHOW POOLS`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			m := rows.FieldDescriptions()
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			for i, f := range m {
				if f.Name == "cl_waiting" {
					switch v := vals[i].(type) {
					case int64:
						n += int(v)
					case int32:
						n += int(v)
					}
				}
			}
		}
		return n
	}

	var logfile string
	{
		rows, err := admin.Query(ctx, `SHOW CONFIG`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			v, _ := rows.Values()
			if fmt.Sprint(v[0]) == "logfile" {
				logfile = fmt.Sprint(v[1])
			}
		}
		rows.Close()
	}
	defer func() {
		b, _ := os.ReadFile(logfile)
		t.Logf("pgbouncer's log:\n%s", b) // "cancel request for idle client": the first cancel was dropped
	}()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := replica.Exec(cctx, `DELETE FROM held WHERE id = 1`)
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); waitingClients() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the DELETE never queued in pgbouncer")
		}
	}
	// The request ends (its bound, its client gone) while the DELETE is queued in pgbouncer.
	cancel()
	cutAt := time.Now()
	select {
	case <-cancelClosed:
	case <-time.After(10 * time.Second):
		t.Fatal("no cancel request was sent")
	}
	// pgbouncer has answered the cancel request (by closing it); the server connection frees up.
	if err := otherTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("committed the other client's transaction %v after the cancel", time.Since(cutAt))
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); {
		var active int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'DELETE FROM held%' AND state = 'active'`).Scan(&active); err != nil {
			t.Fatal(err)
		}
		if active > 0 {
			t.Logf("the DELETE runs on the server %v after the cancel", time.Since(cutAt))
			break
		}
	}
	if err := <-done; err == nil {
		t.Fatal("the cut DELETE succeeded through a held row")
	} else {
		t.Logf("the caller was told %v after %v", err, time.Since(cutAt))
	}
	waiting := func() int {
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND $1::int = ANY(pg_blocking_pids(pid))`, holderPID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The caller has its error: whatever the server still runs for it runs past its answer.
	stillWaiting := waiting()
	{
		rows, _ := direct.Query(ctx, `SELECT pid, state, coalesce(wait_event_type,''), coalesce(wait_event,''), pg_blocking_pids(pid)::text FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'DELETE FROM held%'`)
		for rows.Next() {
			v, _ := rows.Values()
			t.Logf("DELETE backend at the check: %v", v)
		}
		rows.Close()
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Once the lock is free, the orphaned DELETE ends one way or the other: wait for its backend
	// to finish (bounded), then count.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		var active int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND query LIKE 'DELETE FROM held%' AND state = 'active'`).Scan(&active); err != nil {
			t.Fatal(err)
		}
		if active == 0 {
			break
		}
	}
	var rows int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM held`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	releaseLate()
	if stillWaiting != 0 || rows != 1 {
		t.Fatalf("the cut DELETE (queued in pgbouncer when its context ended) still waited on the server after its caller was told it failed (%d backends), and deleted the row once the lock was free (%d rows left; want 1)", stillWaiting, rows)
	}
}
