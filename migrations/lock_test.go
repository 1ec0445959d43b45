package migrations_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3/lock"

	"pitlane/internal/testdb"
	"pitlane/migrations"
)

// probeCounter counts a connection's attempts at goose's lock row and says when there were n.
type probeCounter struct {
	n       atomic.Int64
	reached chan struct{}
	at      int64
}

func (p *probeCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "INSERT INTO goose_lock") && p.n.Add(1) == p.at {
		close(p.reached)
	}
	return ctx
}

func (p *probeCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestMigrateWaitsAsLongAsAnotherHoldsTheLock: a second `pitlane migrate` (every replica's
// start-up hook, a CI job beside a deploy script) waits for the one applying, then finds nothing
// pending. goose's default gave up after 60 looks (5 minutes at 5 s) and exited 1 while the
// first one, building an index CONCURRENTLY behind a backup's snapshot, went on and succeeded.
// Here the other holds the lock for 100 looks (5 ms apart), then lets go: the waiter applies
// what is pending and succeeds. From the upgrade review; negative control: without
// WithTableLockTimeout's unbounded count, Up fails "acquire lock … after retries" at the 60th.
func TestMigrateWaitsAsLongAsAnotherHoldsTheLock(t *testing.T) {
	defer migrations.SetLockProbe(5_000_000)() // 5 ms
	ctx := context.Background()
	url := testdb.NewEmptyURL(t)
	holderDB := stdlib.OpenDBFromPool(testdb.Pool(t, url))
	defer holderDB.Close()
	p, err := migrations.NewProvider(holderDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 630); err != nil { // a release before: the waiter has work to do
		t.Fatal(err)
	}
	holder, err := lock.NewPostgresTableLocker()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Lock(ctx, holderDB); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	probes := &probeCounter{reached: make(chan struct{}), at: 100}
	cfg.Tracer = probes
	waiterDB := stdlib.OpenDB(*cfg)
	defer waiterDB.Close()
	type result struct {
		applied int
		err     error
	}
	done := make(chan result, 1)
	go func() {
		n, err := migrations.Up(ctx, waiterDB)
		done <- result{n, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the waiting migrate ended after %d looks while the other held the lock: applied %d, %v", probes.n.Load(), r.applied, r.err)
	case <-probes.reached:
	}
	if err := holder.Unlock(ctx, holderDB); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.applied == 0 {
		t.Fatalf("the waiting migrate: applied %d, %v; want what was pending and no error", r.applied, r.err)
	}
}
