package live_test

import (
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/live"
)

// The listener's setup (pg_backend_pid, SET, LISTEN) ran on the hub's context alone: a LISTEN
// whose host went silent just then (a failover that left the old host silent while every new
// connection reaches the new primary) held the listener until TCP gave up — never, while the old
// host's kernel still acknowledged — the hub down and every console page polling, though a new
// connection would listen at once (a review of a silent host). The setup is bounded (setupBound)
// and the listener connects again. Negative control (run by hand): unbounded, no LISTEN again in
// a minute.
func TestTheListenerListensAgainAfterItsLISTENMetASilentHost(t *testing.T) {
	t.Parallel()
	proxied, proxy := testdb.FreezeVia(t, testdb.NewURL(t), "LISTEN "+live.Channel)
	b := newBenchOn(t, proxied, func(c *live.Config) { c.IdleAfter = -1 })
	select {
	case <-proxy.Frozen():
	case <-time.After(30 * time.Second):
		t.Fatal("the LISTEN never went out")
	}
	select {
	case <-b.listening:
	case <-time.After(60 * time.Second):
		t.Fatalf("a minute after the listener's LISTEN met a silent host (new connections answer), it has not listened again; hub up: %v", b.hub.Up())
	}
}
