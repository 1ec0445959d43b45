package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/views"
)

// A replica whose every drive hangs at the gateway keeps beating (the
// round's ticker) but stops looking for due work: exactly what PitlaneReplicaNotSweeping fires on
// (time() - pitlane_patrol_last_sweep_timestamp_seconds > 120, not backing off), and what its
// runbook describes ("a stuck drive shows as pitlane_patrol_in_flight staying at its width while
// the last sweep stays old"). The Operations page, where the runbooks send operators, must not
// call that replica "sweeping" in green; it did (observability review, session 32): "not
// sweeping" now, by the alert's own rule (ReplicaHealth.NotSweeping). Negative control: without
// that case in views.ReplicaState, "sweeping".
func TestOpsPageSaysAReplicaIsNotSweeping(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = 1 })
	b.reconcileElsewhere(t)
	b.seedRegistered(t, 1) // due at t0
	status := b.gw.Hold(fakegw.OpStatus)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, 10*time.Millisecond); close(done) }()
	defer func() { status.Open(); cancel(); mustWait(t, done, "the patrol to stop") }()
	mustWait(t, status.Arrived(), "the drive's status call")

	b.clock.Advance(5 * time.Minute) // the drive hangs; the round beats on
	waitBeatAt(t, b, "replica-a", b.clock.Now())

	oc, err := b.svc.OpsCharts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var r *payments.ReplicaHealth
	for i := range oc.Replicas {
		if oc.Replicas[i].ReplicaID == "replica-a" {
			r = &oc.Replicas[i]
		}
	}
	if r == nil || r.LastSweepAt == nil {
		t.Fatalf("no heartbeat with a sweep: %+v", oc.Replicas)
	}
	sinceSweep := oc.At.Sub(*r.LastSweepAt)
	alertFires := sinceSweep > 120*time.Second && !r.BackingOff
	state, _ := views.ReplicaState(*r)
	t.Logf("last sweep %v ago, heartbeat %v ago, in flight %d/%d, backing off %v: PitlaneReplicaNotSweeping fires: %v; /ops says %q",
		sinceSweep, oc.At.Sub(r.BeatAt), r.InFlight, r.Concurrency, r.BackingOff, alertFires, state)
	if alertFires && state == "sweeping" {
		t.Fatalf("PitlaneReplicaNotSweeping fires for replica-a (last sweep %v ago, not backing off) while the Operations page calls it %q",
			sinceSweep, state)
	}
}

// "Counts that stopped moving are never reported as current"
// (operations.md, PitlaneStatsUnavailable). The counts are stamped with the service's clock, the
// database's, which may step back: a failover to a standby with another clock, an NTP step of the
// database host (operations.md: "a step of the database's own clock, or a failover to a standby
// with another clock, reaches every replica within [10 s]"). After a step back of a minute, the
// stored stamp lies in the future: no scrape finds the counts old enough to recount, and every
// scrape handed out the counts of before the step, as current, for the whole minute
// (observability review, session 32). Counts stamped in the future are counted again. Negative
// control: the claim without "refreshed_at > now" answers 0 Registered.
func TestStatsAreCountedAgainAfterTheDatabaseClockStepsBack(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	st, err := b.svc.CachedStats(ctx, 5*time.Second)
	if err != nil || st.DueSessions != 0 {
		t.Fatalf("first count: %+v %v", st, err)
	}
	b.clock.Set(b.clock.Now().Add(-time.Minute)) // the database's clock steps back a minute
	b.seedRegistered(t, 3)                       // three sessions are made
	b.clock.Advance(30 * time.Second)            // 30 s of scrapes later
	st, err = b.svc.CachedStats(ctx, 5*time.Second)
	if n := st.Sessions[payments.StatusRegistered]; err == nil && n != 3 {
		t.Fatalf("30 s after the step, CachedStats(maxAge 5s) answers without error counts from before it: pitlane_sessions{status=\"Registered\"} %d (truly 3), counted at %v, now %v",
			n, st.CountedAt, b.clock.Now())
	}
}
