package payments_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments"
)

// The shop acknowledges a page of the events webhook (200) while the pool's connections are
// ended by the server (pgbouncer restarted, an admin's terminate; the database stays up). The
// cursor's write took a connection idle for milliseconds, which the pool handed out unchecked:
// it failed, and the same page was POSTed again once the lease ran out (a restart audit;
// dbconn.ShouldPing). One POST, the cursor past the page.
func TestAnAcknowledgedPageIsNotSentAgainAfterConnectionsAreEnded(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var mu sync.Mutex
	posts := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		posts++
		first := posts == 1
		mu.Unlock()
		if first {
			if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
				t.Error(err)
			}
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	svc := b.service(b.pool, "replica-a", func(c *payments.Config) {
		c.EventsWebhook = payments.EventsWebhook{URL: srv.URL, Secrets: [][]byte{shopSecret}}
	})
	if n := push(t, svc); n != 0 {
		t.Fatalf("first round sent %d", n)
	}
	b.registered(t, "o-kill-feed", 100)
	feedReady(t, b, 2)
	_, err = svc.PushEvents(ctx)
	t.Logf("the round whose POST was acknowledged: %v", err)
	b.clock.Advance(time.Minute) // past the round's lease
	_, _ = svc.PushEvents(ctx)
	mu.Lock()
	defer mu.Unlock()
	if posts != 1 {
		t.Fatalf("the acknowledged page was POSTed %d times", posts)
	}
}
