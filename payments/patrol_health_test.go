package payments_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Outside review (alerts); each test here failed on the code before it. CachedStats handed a
// scrape the stored counts whenever another scrape held the stats_cache row — however old those
// counts were. When the database is too slow to count in 2 s
// (the situation PitlaneStatsUnavailable's runbook names), every counting scrape holds the row
// for up to 2 s and then rolls back; the scrapes of other replicas that arrived meanwhile answered
// pitlane_stats_up 1 with the last counts that ever succeeded: the gauges froze (the oldest due
// session stayed "0 s overdue"), and max(pitlane_stats_up) == 0 was broken by every such scrape.
func TestCachedStatsDoNotServeOldCountsAsCurrent(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.seedRegistered(t, 1) // due at t0
	st, err := b.svc.CachedStats(ctx, 5*time.Second)
	if err != nil || st.DueSessions != 1 || st.OldestDue != 0 {
		t.Fatalf("first count: %+v %v", st, err)
	}

	// An hour later nothing has swept: the session is an hour overdue. Another replica's scrape is
	// counting right now (the database is slow; its count will time out and roll back).
	b.clock.Advance(time.Hour)
	holder, _ := beginHolder(t, b.pool)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM stats_cache WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	st, err = b.svc.CachedStats(ctx, 5*time.Second)
	if err == nil && st.OldestDue < 30*time.Minute {
		t.Fatalf("CachedStats(maxAge 5s) answered without error counts an hour old: oldest due %v (truly 1h0m0s); "+
			"the scrape reports pitlane_stats_up 1 and pitlane_sweeper_oldest_due_seconds %v", st.OldestDue, st.OldestDue.Seconds())
	}
}

// The patrol judged the gateway over the whole round. A round lasts as long as work is due — a
// drain after an outage is one long round — so when the gateway failed again mid-round, the calls
// it had answered earlier hid the failures: the patrol went on claiming at full width against a
// gateway failing every call until the failures outnumbered the earlier answers. It judges the
// round's last calls now.
func TestAGatewayFailingMidRoundIsBackedOffFrom(t *testing.T) {
	t.Parallel()
	const width, healthy, total = 4, 40, 70
	var claimed atomic.Int64
	var gw *fakegw.Gateway
	b := newBench(t, func(c *payments.Config) {
		c.SweepConcurrency = width
		c.Hooks.AfterSweepClaim = func(_ context.Context, ids []string) {
			if claimed.Add(int64(len(ids))) >= healthy {
				gw.Outage(true) // the gateway goes down in the middle of the round
			}
		}
	})
	gw = b.gw
	b.seedRegistered(t, total)
	if _, err := b.svc.PatrolRound(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := b.gw.Calls(fakegw.OpStatus)
	hb := heartbeatOf(t, b.svc, "replica-a")
	failedAfterOutage := hb.LastFailed
	t.Logf("round: %d calls, %d failed; backing off %v", hb.LastCalls, hb.LastFailed, hb.BackingOff(b.clock.Now()))
	if failedAfterOutage > payments.BackoffMinCalls+2*width {
		t.Fatalf("after the gateway went down the patrol made %d more calls that all failed (of %d status calls in all), "+
			"and kept claiming; backing off afterwards: %v — want it to stop after about %d failures",
			failedAfterOutage, calls, hb.BackingOff(b.clock.Now()), payments.BackoffMinCalls)
	}
}

// The per-replica back-off gauge fell to 0 at the end of each back-off, while the patrol probed a
// gateway still down — for as long as the probe's calls took (a hanging gateway: GATEWAY_TIMEOUT)
// plus up to SWEEP_INTERVAL. Through a sustained outage the gauge read 1 for up to 2 minutes, 0
// for a probe, 1 again…, and PitlanePatrolBackingOff (== 1 for 10m) was reset by every probe.
func TestTheHeartbeatBacksOffWhileProbing(t *testing.T) {
	t.Parallel()
	b := backedOff(t)
	ctx := context.Background()
	gate := b.gw.Hold(fakegw.OpStatus) // the probe's calls hang, as at a gateway that times out
	done := make(chan error, 1)
	go func() { _, err := b.svc.PatrolRound(ctx); done <- err }()
	mustWait(t, gate.Arrived(), "the probe's gateway call")
	hb := heartbeatOf(t, b.svc, "replica-a")
	st := b.svc.PatrolStatus()
	gate.Open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !hb.BackingOff(b.clock.Now()) {
		t.Fatalf("during the probe of a gateway that is still down (back-off level %d), the heartbeat exports "+
			"pitlane_patrol_backing_off 0 (backoff_until %v, now %v)", st.BackoffLevel, hb.BackoffUntil, b.clock.Now())
	}
}

// The same while a replica's own loop beats during the probe (RunSweeper beats every interval,
// and a probe of a hanging gateway outlasts several): each of those beats must keep the back-off.
// Fails with the beat writing no back-off once its end has passed.
func TestTheHeartbeatBacksOffWhileAProbeWaits(t *testing.T) {
	t.Parallel()
	b := backedOff(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	gate := b.gw.Hold(fakegw.OpStatus) // the probe hangs
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(rctx, 20*time.Millisecond); close(done) }()
	mustWait(t, gate.Arrived(), "the probe's gateway call")
	for b.count(t, `SELECT in_flight FROM sweeper_heartbeats WHERE replica_id = 'replica-a'`) == 0 { // a beat during the probe
	}
	hb := heartbeatOf(t, b.svc, "replica-a")
	cancel()
	b.gw.Unhold(fakegw.OpStatus)
	gate.Open()
	mustWait(t, done, "the patrol to stop")
	if !hb.BackingOff(b.clock.Now()) {
		t.Fatalf("a beat during the probe exports pitlane_patrol_backing_off 0 (backoff_until %v, reason %q)", hb.BackoffUntil, hb.Reason)
	}
}

// "The first round after a back-off is a probe of a quarter of the width; full width resumes only
// if the gateway answered it" (core.md). A probe takes whatever is due through the one pool, an
// undelivered customer message too. With only such a message due as the back-off ran out, the
// probe asked the gateway nothing and was judged healthy (no failed call of none): the level went
// back to 0, the gauge to 0 (restarting PitlanePatrolBackingOff's 10 minutes), and the next round
// hit the still-dead gateway at full width and backed off from the first step again. Now a probe
// with nothing to ask the gateway asks it one read that changes nothing (probeGateway): failed,
// the back-off lengthens as a failed probe's does. From an outside review; negative control:
// without the zero-calls case in the round's probe check (producer.judgeProbe), level 0 after
// the message, and 12 status calls in the next round (full width until ten failed).
func TestAProbeThatAskedTheGatewayNothingDoesNotEndTheBackoff(t *testing.T) {
	t.Parallel()
	const width = 4
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = width; c.Notifier = &flakyNotifier{} })
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.seedRegistered(t, 30)
	b.gw.Outage(true) // the gateway is down for the whole test
	if rep, err := b.svc.PatrolRound(ctx); err != nil || !rep.BackingOff {
		t.Fatalf("first round: %+v %v", rep, err)
	}
	b.clock.Advance(payments.PatrolBackoffBase) // a failed probe: the second back-off, 10 s
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	if st := b.svc.PatrolStatus(); !st.BackingOff || st.BackoffLevel != 2 {
		t.Fatalf("after a failed probe: %+v", st)
	}
	// As this back-off runs out no session is due at the gateway, but a customer message is.
	b.exec(t, `UPDATE payment_sessions SET next_check_at = $1 WHERE status = 'Registered'`, b.clock.Now().Add(time.Hour))
	b.clock.Advance(2 * payments.PatrolBackoffBase)
	b.exec(t, `INSERT INTO outbox (kind, to_addr, body, created_at, next_attempt_at) VALUES ('notice', 'c@example.com', 'hello', $1, $1)`,
		b.clock.Now())
	status, finds := b.gw.Calls(fakegw.OpStatus), b.gw.Calls(fakegw.OpFind)
	if rep, err := b.svc.PatrolRound(ctx); err != nil || rep.Driven != 1 {
		t.Fatalf("the probe round: %+v %v, want the message driven", rep, err)
	}
	if n, p := b.gw.Calls(fakegw.OpStatus)-status, b.gw.Calls(fakegw.OpFind)-finds; n != 0 || p != 1 {
		t.Fatalf("the probe round made %d status calls and %d finds, want none and one (the health probe: only the message was due)", n, p)
	}
	st := b.svc.PatrolStatus()
	if st.BackoffLevel != 3 || st.BackoffUntil.Sub(b.clock.Now()) != 4*payments.PatrolBackoffBase || st.Reason == "" {
		t.Errorf("a failed health probe should lengthen the back-off to %v at level 3: %+v", 4*payments.PatrolBackoffBase, st)
	}
	if hb := heartbeatOf(t, b.svc, "replica-a"); !hb.BackingOff(b.clock.Now()) {
		t.Errorf("after a probe of a gateway still down, pitlane_patrol_backing_off 0 (backoff_until %v, reason %q)",
			hb.BackoffUntil, hb.Reason)
	}

	// The sessions fall due against the still-dead gateway: the next round is a probe again, and
	// its failure doubles the back-off.
	b.clock.Advance(4 * payments.PatrolBackoffBase)
	b.exec(t, `UPDATE payment_sessions SET next_check_at = $1 WHERE status = 'Registered'`, b.clock.Now())
	before := b.gw.Calls(fakegw.OpStatus)
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	st = b.svc.PatrolStatus()
	if sent := b.gw.Calls(fakegw.OpStatus) - before; sent > width/4 || st.BackoffLevel != 4 ||
		st.BackoffUntil.Sub(b.clock.Now()) != 8*payments.PatrolBackoffBase {
		t.Errorf("the round after it sent %d calls to the dead gateway (a probe is %d) and backed off for %v at level %d, "+
			"want the doubled %v at level 4", sent, width/4, st.BackoffUntil.Sub(b.clock.Now()), st.BackoffLevel, 8*payments.PatrolBackoffBase)
	}
}

// A back-off ended only at a probe the gateway answered, and a probe went out only with
// something due: a replica with nothing to do when its back-off ran out (a quiet night, every
// failed session scheduled later) kept backing off, pitlane_patrol_backing_off 1 and
// PitlanePatrolBackingOff saying "the gateway keeps failing" for hours after it had recovered
// (an outside review). Now such a round asks the gateway one read that changes nothing, logged as
// a "probe" call of no session, and its answer ends the back-off. Negative control: without
// probeGateway at the round's end (producer.end), no find, level 1 and the heartbeat backing
// off after the round.
func TestAnIdleReplicaEndsItsBackoffOnceTheGatewayAnswers(t *testing.T) {
	t.Parallel()
	b := backedOff(t) // the back-off ran out; the gateway is back
	ctx := context.Background()
	b.exec(t, `UPDATE payment_sessions SET next_check_at = $1 WHERE status = 'Registered'`, b.clock.Now().Add(time.Hour))
	status, finds := b.gw.Calls(fakegw.OpStatus), b.gw.Calls(fakegw.OpFind)
	rep, err := b.svc.PatrolRound(ctx)
	if err != nil || rep.Driven != 0 {
		t.Fatalf("the round: %+v %v, want nothing driven (nothing is due)", rep, err)
	}
	if n, p := b.gw.Calls(fakegw.OpStatus)-status, b.gw.Calls(fakegw.OpFind)-finds; n != 0 || p != 1 {
		t.Fatalf("the round made %d status calls and %d finds, want none and one (the health probe)", n, p)
	}
	if st := b.svc.PatrolStatus(); st.BackingOff || st.BackoffLevel != 0 || st.Reason != "" {
		t.Errorf("the gateway answered the probe, but the patrol still backs off: %+v", st)
	}
	if hb := heartbeatOf(t, b.svc, "replica-a"); hb.BackingOff(b.clock.Now()) {
		t.Errorf("the gateway answered the probe, but pitlane_patrol_backing_off 1 (backoff_until %v, reason %q)", hb.BackoffUntil, hb.Reason)
	}
	if n := b.count(t, `SELECT count(*) FROM gateway_calls WHERE operation = 'probe' AND session_id IS NULL AND outcome = 'ok'`); n != 1 {
		t.Errorf("%d probe calls logged, want 1", n)
	}
}

// PitlaneReplicaNotSweeping (operations.md): "A replica that was removed without a graceful stop
// (scaled down, host lost) keeps its row, and this alert, until the row is reaped a day later".
// The rule fires `unless backing_off == 1`, and pitlane_patrol_backing_off read 1 for any row
// whose back-off reason was set, however old the row (the probe's rule): a replica lost while it
// backed off — when a host or its egress is most likely in trouble — read as backing off for the
// whole day, NotSweeping never fired for it, and PitlanePatrolBackingOff blamed the gateway.
// Now a row not beaten for ReplicaSilentAfter is not backing off. From an outside review;
// negative control: without the freshness term in Heartbeat.BackingOff, the 6-hour-old row
// reads as backing off.
func TestAReplicaLostWhileBackingOffReadsAsNotSweeping(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = 4 })
	b.seedRegistered(t, 30)
	b.gw.Outage(true)
	if rep, err := b.svc.PatrolRound(context.Background()); err != nil || !rep.BackingOff {
		t.Fatalf("first round: %+v %v", rep, err)
	}
	if hb := heartbeatOf(t, b.svc, "replica-a"); !hb.BackingOff(b.clock.Now().Add(payments.ReplicaSilentAfter - time.Second)) {
		t.Fatalf("a replica that beat %v ago while backing off reads as not backing off (reason %q)",
			payments.ReplicaSilentAfter-time.Second, hb.Reason)
	}
	// The replica's host is lost now: its row is never written again.
	b.clock.Advance(6 * time.Hour)
	now := b.clock.Now()
	if hb := heartbeatOf(t, b.svc, "replica-a"); hb.BackingOff(now) || hb.Probing(now) {
		t.Errorf("a replica whose last heartbeat is %v old, and whose back-off ended %v ago, exports "+
			"pitlane_patrol_backing_off 1 (reason %q): PitlaneReplicaNotSweeping is silenced for it until the row is reaped",
			now.Sub(hb.BeatAt), now.Sub(*hb.BackoffUntil), hb.Reason)
	}
}

// backedOff is a patrol of width 4 that backed off from a gateway failing every call of a round
// over 30 due sessions, the back-off just over: its next round probes. The fake's outage answers
// at once; it is lifted, and a test holds the calls to make the gateway hang.
func backedOff(t *testing.T) *bench {
	t.Helper()
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = 4 })
	b.seedRegistered(t, 30)
	b.gw.Outage(true)
	if rep, err := b.svc.PatrolRound(context.Background()); err != nil || !rep.BackingOff {
		t.Fatalf("first round: %+v %v", rep, err)
	}
	b.clock.Advance(payments.PatrolBackoffBase)
	b.gw.Outage(false)
	return b
}
