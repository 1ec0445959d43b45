package handlers_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/live"
)

// A live stream asks auth.Manager.Still before every event that tells something, on the
// stream's request context alone (the live routes have no request bound). On a database that
// did not answer (here: the replica's only pool connection taken, as a silent host's are) the
// stream waited in that read with no bound: no event, not even its heartbeat, and no end at its
// lifetime, its goroutine held as long as the silence (a review of a silent host). The check is
// bounded (stillBound): the stream ends and the browser reconnects and polls. Negative control
// (run by hand): unbounded, nothing in a minute.
func TestALiveStreamDoesNotWaitUnboundedOnASilentDatabase(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "sup@example.com", access.RoleSupport)
	hub := startHub(t, b.url, live.Config{Name: "silent-stream", Heartbeat: time.Second})
	one := testdb.PoolOf(t, b.pool, 1)
	_, e := b.replicaWith(one, "replica-silent-stream", b.gw, hub)
	a := newAgent(t, e)
	a.login("sup@example.com")
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	t.Cleanup(hub.Close)
	es := mustOpenStream(t, srv, a, "/live/dashboard?since="+hub.Position().String())

	held, err := one.Acquire(context.Background()) // the database answers nothing from now on
	if err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			held.Release()
		}
	}
	t.Cleanup(release)
	b.payment(t, "o-silent-stream", 1999) // a change the dashboard hears: its stream asks Still

	// The stream either ends or goes on beating (every second); it must do something within a minute.
	read := make(chan error, 1)
	go func() {
		_, err := es.r.ReadString('\n')
		read <- err
	}()
	select {
	case err := <-read:
		t.Logf("the stream moved on: %v", err)
	case <-time.After(60 * time.Second):
		release()
		t.Fatal("60 s into a database silence the live stream has neither ended nor sent an event or a heartbeat: it waits in its sign-in check (auth.Manager.Still) with no bound")
	}
}
