package web_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// TestMetricsPatrolHeartbeats: every replica's heartbeat row is on /metrics by replica (what a
// "replica not sweeping" alert reads), with its back-off; this replica's own state is there too.
func TestMetricsPatrolHeartbeats(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	clock := payments.NewManualClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	fake := fakegw.New()
	cfg := func(replica string) payments.Config {
		return payments.Config{Gateway: fake, Clock: clock, ReplicaID: replica, LockTimeout: 10 * time.Second,
			SweepConcurrency: 2, Version: "v-test"}
	}
	svc := payments.NewService(pool, cfg("replica-a"))
	other := payments.NewService(pool, cfg("replica-b"))
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: pool, ReplicaID: "replica-a", Payments: svc})
	ctx := context.Background()
	actor := payments.Actor{Kind: payments.ActorAPI, ID: "t"}
	for i := range 12 {
		if _, err := svc.Create(ctx, actor, payments.CreateInput{OrderID: fmt.Sprint("patrol-", i), Amount: 100, Currency: "EUR"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.PatrolRound(ctx); err != nil { // nothing due yet: a quiet round
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	fake.Outage(true)
	if rep, err := other.PatrolRound(ctx); err != nil || !rep.BackingOff {
		t.Fatalf("replica-b's round in an outage = %+v %v", rep, err)
	}
	body := do(e, http.MethodGet, "/metrics").Body.String()
	at := func(d time.Duration) string { return fmt.Sprintf("%g", float64(clock.Now().Add(d).Unix())) }
	for _, line := range []string{
		`pitlane_patrol_heartbeat_timestamp_seconds{replica="replica-a"} ` + at(-time.Minute),
		`pitlane_patrol_last_sweep_timestamp_seconds{replica="replica-a"} ` + at(-time.Minute),
		`pitlane_patrol_backing_off{replica="replica-a"} 0`,
		`pitlane_patrol_backing_off{replica="replica-b"} 1`,
		`pitlane_patrol_backoff_until_timestamp_seconds{replica="replica-b"} ` + at(payments.PatrolBackoffBase),
		`pitlane_patrol_in_flight{replica="replica-b"} 0`,
		`pitlane_patrol_info{concurrency="2",replica="replica-a",version="v-test"} 1`,
		`pitlane_patrol_self_backing_off 0`,
		`pitlane_patrol_self_in_flight 0`,
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("missing line %q", line)
		}
	}
	if !strings.Contains(body, `pitlane_patrol_last_round_gateway_failed{replica="replica-b"} `) {
		t.Error("missing replica-b's failed calls")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}
