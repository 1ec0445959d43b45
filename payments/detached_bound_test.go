package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
)

// notifyFunc is a Notifier made of a function.
type notifyFunc func(ctx context.Context, m payments.Message) error

func (f notifyFunc) Notify(ctx context.Context, m payments.Message) error { return f(ctx, m) }

// The writes that must be made though their request or round ended — here a cancel code's
// outbox row given back when the request that sent it was cut mid-delivery — wait for a database
// that does not answer by payments.RecordGrace at most. Under context.WithoutCancel alone the
// give-back waited as long as the database did, and so did the request (a stop of the replica
// too). The database "does not answer" as in TestAuditOutlivesItsRequestByItsGraceAtMost: the
// only connection of the service's pool is taken. Negative control: with the give-back under
// context.WithoutCancel again, the request is still waiting after a minute.
func TestADeliveryCutByItsRequestGivesTheRowBackWithinTheGrace(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	one := testdb.PoolOf(t, b.pool, 1)
	req, cut := context.WithCancel(context.Background())
	defer cut()
	heldc := make(chan *pgxpool.Conn, 1) // the connection the notifier took
	svc := b.service(one, "replica-one", func(c *payments.Config) {
		c.Notifier = notifyFunc(func(ctx context.Context, m payments.Message) error {
			held, err := one.Acquire(context.Background())
			if err != nil {
				return err
			}
			heldc <- held
			cut() // the client hangs up while the message is on its way
			return ctx.Err()
		})
	})
	sess := b.registered(t, "o-detached-bound", 100)
	done := make(chan error, 1)
	go func() {
		_, err := svc.RequestCancel(req, api, sess.ID)
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		(<-heldc).Release()
		<-done
		t.Fatal("the request waited a minute for the give-back of its message, past its grace")
	}
	select {
	case held := <-heldc:
		held.Release()
	default:
		t.Fatal("the code was never handed to the notifier")
	}
	// The row was not given back (the database did not answer): it stays the writer's until its
	// lease ends, then the patrol's — the code is not lost.
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND lease_until IS NOT NULL`); n != 1 {
		t.Fatalf("%d undelivered leased messages, want the code", n)
	}
}
