package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments"
)

// A replica told to stop with SHUTDOWN_DRAIN set answers /readyz 503 "stopping" at once and goes
// on serving until the drain ends, so its balancer stops routing here before the listener closes
// (closed at once, a request routed here meanwhile found the port refused); then it stops as
// before. Negative control (run by hand): without the drain, /readyz is refused (the listener
// closed); without Stopping, /readyz answers 200 while the replica is on its way out.
func TestAStoppingReplicaDrainsUnready(t *testing.T) {
	t.Parallel()
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	r := serveToDrain(t, ctx)
	base, draining, done := r.base, r.draining, r.done
	mustReceive(t, r.synced, "the database clock's first read")
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	readyz := func() (int, string) {
		t.Helper()
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("/readyz: %v", err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var b struct{ Reason string }
		_ = json.Unmarshal(body, &b)
		return resp.StatusCode, b.Reason
	}
	if code, reason := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before the stop = %d %q", code, reason)
	}

	stop() // SIGTERM
	end := mustReceive(t, draining, "the drain")
	if code, reason := readyz(); code != http.StatusServiceUnavailable || reason != "stopping" {
		t.Errorf("/readyz while draining = %d %q, want 503 \"stopping\"", code, reason)
	}
	if resp, err := client.Get(base + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz while draining = %v %v, want served", resp, err)
	} else {
		resp.Body.Close()
	}
	end() // the drain's time is over
	if err := mustReceive(t, done, "the stop after the drain"); err != nil {
		t.Fatalf("serve after the drain: %v", err)
	}
}

// mustReceive is what ch delivers, or the test fails after a generous bound.
func mustReceive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never came", what)
	}
	var zero T
	return zero
}

// dev stops serving when its private PostgreSQL exits (a cause on its context): with
// SHUTDOWN_DRAIN set the replica drained first all the same, serving on with no database for up
// to five minutes (a review). Only a stop asked for drains. Negative control (run by hand):
// draining on any cause, the drain starts.
func TestNoDrainWhenTheStopIsForcedOnTheReplica(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(nil) })
	r := serveToDrain(t, ctx)
	draining, done := r.draining, r.done
	died := errors.New("the private PostgreSQL exited")
	cancel(died)
	select {
	case end := <-draining:
		t.Errorf("serve drains (SHUTDOWN_DRAIN 4m) after its database died")
		end()
		<-done
	case err := <-done:
		if !errors.Is(err, died) {
			t.Errorf("serve = %v, want the cause it was stopped with", err)
		}
	}
}

// drainServe is a replica serving with SHUTDOWN_DRAIN=4m until ctx ends (serveToDrain): its
// address, the drain's start (its end to call), its stop, and its database clock's first read.
type drainServe struct {
	base     string
	draining chan func()
	done     chan error
	synced   <-chan struct{}
}

func serveToDrain(t *testing.T, ctx context.Context) drainServe {
	t.Helper()
	pool := testdb.New(t)
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "SECRET_KEY": strings.Repeat("s", 32),
			"GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k", "SHUTDOWN_DRAIN": "4m"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ShutdownDrain != 4*time.Minute {
		t.Fatalf("SHUTDOWN_DRAIN read as %s", cfg.ShutdownDrain)
	}
	r := drainServe{draining: make(chan func(), 1), done: make(chan error, 1)}
	urls := make(chan string, 1)
	opts := serveOptions{
		ready:    func(u string) { urls <- u },
		clock:    func(c *payments.DatabaseClock) { r.synced = c.Synced() },
		draining: func(end func()) { r.draining <- end },
	}
	go func() { r.done <- serveWith(ctx, cfg, pool, slog.New(slog.DiscardHandler), opts) }()
	select {
	case r.base = <-urls:
	case err := <-r.done:
		t.Fatalf("serve: %v", err)
	}
	return r
}
