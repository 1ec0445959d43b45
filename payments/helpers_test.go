package payments_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type bench struct {
	url   string
	pool  *pgxpool.Pool
	gw    *fakegw.Gateway
	clock *payments.ManualClock
	svc   *payments.Service
	plain *payments.Service // same database, gateway and clock, no hooks: for setting up
}

// newBench gives a test its own migrated database, a fake gateway, a manual clock and a service.
func newBench(t testing.TB, mod ...func(*payments.Config)) *bench {
	t.Helper()
	url := testdb.NewURL(t)
	b := &bench{url: url, pool: testdb.Pool(t, url), gw: fakegw.New(), clock: payments.NewManualClock(t0)}
	b.svc = b.service(b.pool, "replica-a", mod...)
	b.plain = b.service(b.pool, "setup")
	return b
}

// service builds another service (another "replica") over a pool of the same database.
func (b *bench) service(pool *pgxpool.Pool, replica string, mod ...func(*payments.Config)) *payments.Service {
	cfg := payments.Config{Gateway: b.gw, Clock: b.clock, ReplicaID: replica, CodeSecret: []byte("test-secret"),
		LockTimeout: 10 * time.Second}
	for _, m := range mod {
		m(&cfg)
	}
	return payments.NewService(pool, cfg)
}

func (b *bench) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", sql, err)
	}
	return n
}

// texts is the one text column of sql's rows.
func (b *bench) texts(t testing.TB, sql string, args ...any) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%q: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%q: %v", sql, err)
	}
	return out
}

// paymentUpdated delivers the gateway's event id saying its payment paymentID (carrying reference)
// changed, as the webhook receiver hands it on.
func (b *bench) paymentUpdated(t testing.TB, id, paymentID, reference string) {
	t.Helper()
	if _, err := b.svc.HandleGatewayEvent(context.Background(), payments.GatewayEvent{ID: id, Type: "payment.updated",
		PaymentID: paymentID, Reference: reference}); err != nil {
		t.Fatal(err)
	}
}

// resolveOpenCase resolves the session's open case of kind as finance does, with note.
func (b *bench) resolveOpenCase(t testing.TB, sessionID, kind, note string) {
	t.Helper()
	var id int64
	if err := b.pool.QueryRow(context.Background(), `SELECT id FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL`,
		sessionID, kind).Scan(&id); err != nil {
		t.Fatalf("no open %s case: %v", kind, err)
	}
	if _, err := b.svc.ResolveCase(context.Background(), fin1, id, note, ""); err != nil {
		t.Fatal(err)
	}
}

// openCaseKinds are the kinds of a session's open cases, oldest first.
func (b *bench) openCaseKinds(t testing.TB, sessionID string) []string {
	t.Helper()
	return b.texts(t, `SELECT kind FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL ORDER BY id`, sessionID)
}

// waitLockWaiters waits until at least n backends of the test's database wait for a lock (pg_locks not granted):
// how a test knows a concurrent operation is blocked exactly where the protocol says it must be.
func waitLockWaiters(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var waiting int
		if err := pool.QueryRow(context.Background(),
			`SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND l.pid <> pg_backend_pid() AND a.datname = current_database()`).Scan(&waiting); err != nil {
			t.Fatalf("pg_locks: %v", err)
		}
		if waiting >= n {
			return
		}
	}
	t.Fatalf("no %d backends ever waited for a lock", n)
}

// parker is a hook that stops each caller until the test releases it.
type parker struct {
	arrived chan string
	release chan struct{}
}

func newParker() *parker {
	return &parker{arrived: make(chan string, 1000), release: make(chan struct{}, 1000)}
}

func (p *parker) hook(ctx context.Context, id string) {
	p.arrived <- id
	select {
	case <-p.release:
	case <-ctx.Done():
	}
}

func (p *parker) let(n int) {
	for range n {
		p.release <- struct{}{}
	}
}

func mustWait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// scale picks a scenario's size: small in `make test`, full in `make polygon` (PITLANE_SCALE=full).
func scale(small, full int) int {
	if os.Getenv("PITLANE_SCALE") == "full" {
		return full
	}
	return small
}

var api = payments.Actor{Kind: payments.ActorAPI, ID: "test-client"}

// beginHolder opens the transaction a race test holds a lock in, and returns it with its
// backend's pid (for waitBlockedBy). It is rolled back when the test ends unless committed.
func beginHolder(t *testing.T, pool *pgxpool.Pool) (pgx.Tx, int32) {
	t.Helper()
	ctx := context.Background()
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Rollback(ctx) }) //nolint:errcheck // a no-op after commit
	var pid int32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return holder, pid
}

// statusAfter answers Status as its gateway does, after running before once.
type statusAfter struct {
	payments.Gateway
	once   sync.Once
	before func()
}

func (g *statusAfter) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	g.once.Do(g.before)
	return g.Gateway.Status(ctx, id)
}
