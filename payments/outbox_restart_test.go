package payments_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments"
)

// killingNotifier delivers, and while its POST is on the wire the database's connections are
// ended by the server (pgbouncer restarted, an admin's pg_terminate_backend, a pooler's KILL):
// the database itself stays up and answers at once.
type killingNotifier struct {
	admin *pgx.Conn
	mu    sync.Mutex
	got   []payments.Message
}

func (n *killingNotifier) Notify(ctx context.Context, m payments.Message) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, m)
	if len(n.got) == 1 {
		if _, err := n.admin.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
			return err
		}
	}
	return nil
}

// A one-time code's POST succeeds while the pool's connections are ended by the server (the
// database stays up). Recording the delivery takes a pooled connection idle for a few
// milliseconds, which pgxpool handed out unchecked (it pings only after a second idle): the
// record failed, the row kept the writer's lease and the patrol sent the same code again once
// the lease ran out (a restart audit; dbconn.ShouldPing). One POST, the row delivered.
func TestACodeSentAsConnectionsAreEndedIsRecordedNotSentAgain(t *testing.T) {
	t.Parallel()
	n := &killingNotifier{}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	n.admin = admin
	sess := b.registered(t, "o-kill", 100)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("request answered: undelivered %q", ch.Undelivered)
	var delivered int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`).Scan(&delivered); err != nil {
		t.Fatal(err)
	}
	// The patrol's next look once the writer's lease has run out.
	b.clock.Advance(2 * time.Minute)
	if _, err := b.svc.DeliverOutbox(ctx); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	posts := len(n.got)
	n.mu.Unlock()
	if delivered != 1 || posts != 1 {
		t.Fatalf("after a POST that succeeded: delivered rows %d, POSTs %d in all; want 1 and 1", delivered, posts)
	}
}
