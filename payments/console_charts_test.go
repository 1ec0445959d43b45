package payments_test

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// eventsSettled waits until no transaction of the test cluster (its tests run in parallel) holds
// the snapshot's xmin below a settlement already committed: a sample then counts it.
func (b *bench) eventsSettled(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for b.count(t, `SELECT count(*) FROM session_events WHERE xid >= pg_snapshot_xmin(pg_current_snapshot())`) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a transaction in the test cluster has been running for a minute: samples cannot count the events committed after it")
		}
	}
}

// sampleAt sets the clock and samples as svc; it reports whether svc wrote the minute's row.
// It samples once every session event committed so far can be counted: a sample counts
// settlements by transaction id, below the oldest transaction running in the cluster
// (opsSampleSQL), and the test cluster is shared with parallel tests whose open transactions
// hold that back — the settlement would be counted, by the next sample, in a minute the test did
// not mean (the feed's tests wait for the same thing: feedAll). An event still being written is
// not committed and not waited for.
func (b *bench) sampleAt(t *testing.T, svc *payments.Service, at time.Time) bool {
	t.Helper()
	b.eventsSettled(t)
	b.clock.Set(at)
	wrote, err := svc.SampleOps(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return wrote
}

func (b *bench) samples(t *testing.T) []payments.OpsSample {
	t.Helper()
	s, err := b.svc.OpsSamples(context.Background(), t0.Add(-72*time.Hour), t0.Add(72*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// failedAt makes a Failed session through the core at the clock's time.
func (b *bench) failedAt(t *testing.T, order string) {
	t.Helper()
	s := b.registered(t, order, 100)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayDeclined)
	if s, err := b.plain.Check(context.Background(), api, s.ID); err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
}

// TestSampleOpsOneRowPerMinute: two replicas sample the same minute; one row is written, by the
// first. It holds the active sessions by state and the patrol's backlog as they are, and the
// sessions settled since the previous sample — the minute before when there is none within an
// hour, so one sample never reads a day of events.
func TestSampleOpsOneRowPerMinute(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	other := b.service(b.pool, "replica-b")

	b.clock.Set(t0.Add(-90 * time.Second)) // 11:58:30: settled before the first sample's minute
	b.completed(t, "o-early", 100)
	b.clock.Set(t0.Add(-30 * time.Second)) // 11:59:30: settled within it
	b.completed(t, "o-paid", 100)
	b.failedAt(t, "o-declined")
	due := b.registered(t, "o-due", 100) // next look 11:59:35
	leased := b.registered(t, "o-leased", 100)
	b.exec(t, `UPDATE payment_sessions SET lease_owner = 'replica-b', lease_until = $2, lease_token = gen_random_uuid() WHERE id = $1`,
		leased.ID, t0.Add(time.Minute))
	flagged := b.registered(t, "o-flagged", 100)
	b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'test' WHERE id = $1`, flagged.ID, t0.Add(-time.Hour))

	if !b.sampleAt(t, b.svc, t0.Add(20*time.Second)) {
		t.Fatal("replica-a did not write the first sample")
	}
	if b.sampleAt(t, other, t0.Add(30*time.Second)) || b.sampleAt(t, b.svc, t0.Add(59*time.Second)) {
		t.Fatal("a second sample was written for the same minute")
	}
	if n := b.count(t, `SELECT count(*) FROM ops_samples WHERE taken_by = 'replica-a'`); n != 1 {
		t.Fatalf("%d rows by replica-a", n)
	}
	s := b.samples(t)
	if len(s) != 1 {
		t.Fatalf("%d samples, want 1", len(s))
	}
	got := s[0]
	if !got.At.Equal(t0) || !got.TakenAt.Equal(t0.Add(20*time.Second)) || !got.SettledSince.Equal(t0.Add(-time.Minute)) {
		t.Fatalf("sample at %s taken %s settled since %s", got.At, got.TakenAt, got.SettledSince)
	}
	if got.Active[payments.StatusRegistered] != 3 || got.Active[payments.StatusUnknown] != 0 {
		t.Fatalf("active: %v", got.Active)
	}
	if got.Settled[payments.StatusCompleted] != 1 || got.Settled[payments.StatusFailed] != 1 || got.Settled[payments.StatusCanceled] != 0 {
		t.Fatalf("settled in [11:59, 12:00): %v (o-early settled at 11:58:30 must not count)", got.Settled)
	}
	if got.Due != 1 || got.Leased != 1 || got.Flagged != 1 || got.OldestDueAt == nil || !got.OldestDueAt.Equal(*due.NextCheckAt) {
		t.Fatalf("backlog: due %d leased %d flagged %d oldest %v (want 1, 1, 1, %v)", got.Due, got.Leased, got.Flagged, got.OldestDueAt, due.NextCheckAt)
	}

	// The next minute, replica-b comes first; the settled count goes on where the last stopped.
	b.clock.Set(t0.Add(50 * time.Second))
	b.gw.SetStatus(due.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.plain.Check(context.Background(), api, due.ID); err != nil {
		t.Fatal(err)
	}
	if !b.sampleAt(t, other, t0.Add(70*time.Second)) {
		t.Fatal("replica-b did not write the 12:01 sample")
	}
	// A gap of three minutes (no patrol ran): the next sample counts all of it.
	b.clock.Set(t0.Add(3 * time.Minute))
	b.failedAt(t, "o-in-the-gap")
	if !b.sampleAt(t, b.svc, t0.Add(5*time.Minute+10*time.Second)) {
		t.Fatal("no 12:05 sample")
	}
	// Two hours without a patrol: the first sample after counts its own minute before only.
	b.clock.Set(t0.Add(time.Hour))
	b.failedAt(t, "o-long-ago")
	b.clock.Set(t0.Add(2*time.Hour + 9*time.Minute + 30*time.Second))
	b.failedAt(t, "o-just-before")
	if !b.sampleAt(t, b.svc, t0.Add(2*time.Hour+10*time.Minute)) {
		t.Fatal("no 14:10 sample")
	}
	s = b.samples(t)
	type row struct {
		at, since       time.Duration
		completed, fail int
	}
	var rows []row
	for _, o := range s {
		rows = append(rows, row{o.At.Sub(t0), o.SettledSince.Sub(t0), o.Settled[payments.StatusCompleted], o.Settled[payments.StatusFailed]})
	}
	want := []row{
		{0, -time.Minute, 1, 1},
		{time.Minute, 0, 1, 0},
		{5 * time.Minute, time.Minute, 0, 1},
		{2*time.Hour + 10*time.Minute, 2*time.Hour + 9*time.Minute, 0, 1},
	}
	if !slices.Equal(rows, want) {
		t.Fatalf("samples (at, since, completed, failed):\n got %v\nwant %v", rows, want)
	}
	if n := b.count(t, `SELECT count(*) FROM ops_samples WHERE at = $1 AND taken_by = 'replica-b'`, t0.Add(time.Minute)); n != 1 {
		t.Fatal("the 12:01 sample is not replica-b's")
	}
}

// Each sample counts the settlements since the latest sample before its minute, so two samples
// must never count from the same one (an outside review, numbers): replica-a read 12:00:59.8 and
// its statement waited while replica-b sampled 12:01 at 12:01:00.2 — both counted from 11:59 —
// or two replicas sampled consecutive minutes at once, neither seeing the other's row. One
// completion showed twice in the Operations page's bars for the samples' three days. A minute a
// later sample covered is not written, and samplers are serialised by LockOpsSample, so each
// one's snapshot sees the samples before it (pg_blocking_pids shows the wait). Negative
// controls: with the guard at = $1, the late 12:00 sample is written and counts the completion
// again; without the lock, the 12:02 sample does not wait and counts from 12:01 beside 12:03.
func TestSampleOpsNeverCountFromOneSampleTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBench(t)
	other := b.service(b.pool, "replica-b")
	completions := func() (samples, truth int) {
		t.Helper()
		for _, o := range b.samples(t) {
			samples += o.Settled[payments.StatusCompleted]
		}
		return samples, b.count(t, `SELECT count(*) FROM session_events WHERE to_status = 'Completed'`)
	}
	if !b.sampleAt(t, b.plain, t0.Add(-time.Minute)) { // 11:59
		t.Fatal("no 11:59 sample")
	}
	b.clock.Set(t0.Add(-30 * time.Second))
	b.completed(t, "o-paid", 100)                                        // settles at 11:59:30
	if !b.sampleAt(t, other, t0.Add(time.Minute+200*time.Millisecond)) { // replica-b: 12:01
		t.Fatal("no 12:01 sample")
	}
	if b.sampleAt(t, b.svc, t0.Add(59*time.Second+800*time.Millisecond)) { // replica-a: 12:00, late
		t.Error("the 12:00 sample was written after 12:01's, which counted its minute already")
	}
	// Counted twice is the fault; a count held back by another test's open transaction (the
	// cluster's xmin) is the next sample's, and no part of this test.
	if got, truth := completions(); got > truth {
		t.Fatalf("completions in the samples %d, in session_events %d (a minute's sample written after the next)", got, truth)
	}

	// Two at once: replica-b's sampler of 12:03 holds the lock, its row not committed yet, while
	// replica-a samples 12:02.
	b.clock.Set(t0.Add(2*time.Minute - 30*time.Second))
	b.completed(t, "o-paid-2", 100) // settles at 12:01:30
	b.eventsSettled(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var holder int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM (SELECT pg_advisory_xact_lock($1, 0)) l`, int32(payments.LockOpsSample)).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if err := payments.SampleOpsAs(ctx, tx, "replica-b", t0.Add(3*time.Minute+200*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(t0.Add(2*time.Minute + 500*time.Millisecond))
	done := make(chan bool, 1)
	go func() {
		wrote, err := b.svc.SampleOps(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- wrote
	}()
	waitBlockedBy(t, b.pool, holder)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if mustWait(t, done, "replica-a's sample of 12:02") {
		t.Error("the 12:02 sample was written beside 12:03's, which counted its minute already")
	}
	if got, truth := completions(); got > truth {
		t.Fatalf("completions in the samples %d, in session_events %d (two samplers at once)", got, truth)
	}
}

// TestSampleOpsCountsALateCommitOnce: a session's Completed event carries the time its apply
// read the clock, before it waited for the order and session locks; it becomes visible only at
// commit. When the minute's sample ran in between, the sample of 12:00 counted [11:59, 12:00) by
// created_at without the row, and the next ones counted from 12:00 on, after it: the settlement
// was in no sample, in no bar. Now a sample counts by the writing transaction's id up to its own
// snapshot's xmin, and the next one from there: the apply still open at 12:00 is counted at
// 12:01, once. Negative control: opsSampleSQL counting created_at in [since, $1) again — the
// samples count 0 completions.
func TestSampleOpsCountsALateCommitOnce(t *testing.T) {
	t.Parallel()
	var b *bench
	armed := false
	b = newBench(t, func(c *payments.Config) {
		c.Hooks.AfterApplyLock = func(ctx context.Context, id string) {
			if !armed {
				return
			}
			armed = false
			// The apply read 11:59:59.900 and waits here (a lock wait, a slow commit) while the
			// first patrol of 12:00 samples the minute.
			b.sampleAt(t, b.plain, t0.Add(time.Second))
		}
	})
	b.sampleAt(t, b.plain, t0.Add(-time.Minute)) // 11:59
	b.clock.Set(t0.Add(-50 * time.Second))
	s := b.registered(t, "o-late", 100)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	b.clock.Set(t0.Add(-100 * time.Millisecond))
	armed = true
	got, err := b.svc.Check(context.Background(), api, s.ID)
	if err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("check: %s %v", got.Status, err)
	}
	if armed {
		t.Fatal("the apply never reached its locks: nothing was sampled while it was open")
	}
	b.sampleAt(t, b.plain, t0.Add(61*time.Second))  // 12:01
	b.sampleAt(t, b.plain, t0.Add(121*time.Second)) // 12:02
	if n := b.count(t, `SELECT count(*) FROM session_events WHERE to_status = 'Completed'`); n != 1 {
		t.Fatalf("%d Completed events", n)
	}
	var per []int
	total := 0
	for _, o := range b.samples(t) {
		per = append(per, o.Settled[payments.StatusCompleted])
		total += o.Settled[payments.StatusCompleted]
	}
	if total != 1 || len(per) != 4 || per[1] != 0 {
		t.Fatalf("one session completed (event at 11:59:59.9, committed after the 12:00 sample): completions per sample %v, want 1 in all and none at 12:00", per)
	}
}

// TestRunSweeperSamplesOps: the patrol's upkeep loop writes the minute's sample and its housekeeping
// reaps samples past OpsSampleRetention (and redacts dead codes in the outbox), while the
// reconciliation, on a loop of its own, is held at the gateway.
func TestRunSweeperSamplesOps(t *testing.T) {
	t.Parallel()
	passed := make(chan struct{}, 10)
	b := newBench(t, func(c *payments.Config) {
		c.Hooks.AfterUpkeep = func(context.Context) { passed <- struct{}{} }
	})
	b.seedRegistered(t, 2)
	old, kept := t0.Add(-payments.OpsSampleRetention-time.Hour), t0.Add(-payments.OpsSampleRetention+time.Hour)
	b.sampleAt(t, b.plain, old)
	b.sampleAt(t, b.plain, kept)
	// A code from an hour ago, never delivered (no notifier): the housekeeping redacts it.
	b.exec(t, `INSERT INTO outbox (kind, to_addr, body, redacted_body, created_at)
		VALUES ('cancel_code', 'ana@example.com', 'your code is 123456', 'your code is ••••••', $1)`, t0.Add(-time.Hour))
	b.clock.Set(t0.Add(15 * time.Second))
	gate := b.gw.Hold(fakegw.OpFind)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, time.Hour); close(done) }()
	mustWait(t, gate.Arrived(), "the patrol's reconciliation (its own loop)")
	mustWait(t, passed, "the upkeep loop's first pass")
	var ats []time.Time
	for _, s := range b.samples(t) {
		ats = append(ats, s.At)
	}
	if !slices.EqualFunc(ats, []time.Time{kept, t0}, time.Time.Equal) {
		t.Fatalf("samples at %v, want the kept one and this minute's (%s, %s)", ats, kept, t0)
	}
	if n := b.count(t, `SELECT count(*) FROM ops_samples WHERE at = $1 AND taken_by = 'replica-a' AND registered = 2`, t0); n != 1 {
		t.Fatal("this minute's sample is not the patrol's, or miscounted")
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE body LIKE '%123456%'`); n != 0 {
		t.Fatal("the housekeeping left a dead code in clear in the outbox")
	}
	cancel()
	gate.Open()
	mustWait(t, done, "the patrol to stop")
}

// percentileCont is PostgreSQL's percentile_cont: linear interpolation between the two nearest
// ranks of the sorted values.
func percentileCont(vals []float64, p float64) float64 {
	v := slices.Clone(vals)
	slices.Sort(v)
	pos := p * float64(len(v)-1)
	lo := math.Floor(pos)
	if lo == pos {
		return v[int(lo)]
	}
	return v[int(lo)] + (pos-lo)*(v[int(lo)+1]-v[int(lo)])
}

// TestGatewayMinutes: calls per minute and outcome, and the latency percentiles of the calls
// that reached the gateway, over exactly the window asked for; empty minutes are there, with no
// percentile. Calls made through the core count in the minute they ended.
func TestGatewayMinutes(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	call := func(at time.Time, outcome string, ms int) {
		b.exec(t, `INSERT INTO gateway_calls (operation, outcome, latency_ms, created_at) VALUES ('status', $1, $2, $3)`, outcome, ms, at)
	}
	m := t0.Add(-time.Minute) // 11:59
	sent := []float64{}
	for _, ms := range []int{10, 20, 30, 40, 100} {
		call(m.Add(time.Duration(ms)*time.Millisecond), "ok", ms)
		sent = append(sent, float64(ms))
	}
	call(m.Add(5*time.Second), "unknown", 5000)
	call(m.Add(6*time.Second), "definitive", 50)
	sent = append(sent, 5000, 50)
	call(m.Add(7*time.Second), "not_sent", 0)
	call(m.Add(59*time.Second), "not_sent", 0)
	call(t0.Add(-59*time.Minute-time.Millisecond), "ok", 1) // 11:00:59.999: before the window
	call(t0.Add(30*time.Second+time.Microsecond), "ok", 1)  // after now
	call(t0.Add(30*time.Second), "ok", 7)                   // now: in
	b.clock.Set(t0.Add(10 * time.Second))
	b.completed(t, "o-now", 100) // a register and a status call at 12:00:10

	b.clock.Set(t0.Add(30 * time.Second))
	from := t0.Add(-59 * time.Minute)
	got, err := b.svc.GatewayMinutes(ctx, from, b.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 60 || !got[0].Start.Equal(from) || !got[59].Start.Equal(t0) {
		t.Fatalf("%d minutes from %v", len(got), got[0].Start)
	}
	for i, g := range got[:58] {
		if g.Total != 0 || g.P50 != nil || g.P95 != nil || len(g.Calls) != 0 {
			t.Fatalf("minute %d (%s) should be empty: %+v", i, g.Start, g)
		}
	}
	g := got[58]
	if g.Total != 9 || g.Calls[payments.GatewayOK] != 5 || g.Calls["unknown"] != 1 || g.Calls["definitive"] != 1 || g.Calls["not_sent"] != 2 {
		t.Fatalf("11:59: %+v", g)
	}
	if g.P50 == nil || g.P95 == nil || math.Abs(*g.P50-percentileCont(sent, 0.5)) > 1e-9 || math.Abs(*g.P95-percentileCont(sent, 0.95)) > 1e-9 {
		t.Fatalf("11:59 p50 %v p95 %v, want %v %v (not_sent calls left out)", g.P50, g.P95, percentileCont(sent, 0.5), percentileCont(sent, 0.95))
	}
	if now := got[59]; now.Total != 3 || now.Calls[payments.GatewayOK] != 3 || now.P50 == nil {
		t.Fatalf("12:00 (the core's register and status, and the call made now): %+v", now)
	}
	// A window ending on a minute's start has that minute (under way) as its last.
	if got, err := b.svc.GatewayMinutes(ctx, from, t0); err != nil || len(got) != 60 || got[59].Total != 0 {
		t.Fatalf("window to 12:00:00: %d minutes, %v", len(got), err)
	}
}

// TestReplicaHealth: each replica's heartbeat with the sessions leased to it now (expired leases
// and settled sessions are not), silent when it has not beaten for a minute, backing off when
// its heartbeat says so.
func TestReplicaHealth(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	other := b.service(b.pool, "replica-b")
	b.clock.Set(t0.Add(-2 * time.Minute))
	if _, err := other.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(t0)
	lease := func(s payments.Session, owner string, until time.Time) {
		b.exec(t, `UPDATE payment_sessions SET lease_owner = $2, lease_until = $3, lease_token = gen_random_uuid() WHERE id = $1`, s.ID, owner, until)
	}
	lease(b.registered(t, "o-1", 100), "replica-a", t0.Add(time.Minute))
	lease(b.registered(t, "o-2", 100), "replica-a", t0.Add(time.Minute))
	lease(b.registered(t, "o-3", 100), "replica-b", t0.Add(-time.Second)) // expired
	lease(b.completed(t, "o-4", 100), "replica-b", t0.Add(time.Minute))   // settled
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	b.exec(t, `UPDATE sweeper_heartbeats SET backoff_until = $1, backoff_reason = 'the gateway failed 9 of 10 calls' WHERE replica_id = 'replica-a'`,
		t0.Add(30*time.Second))
	got, err := b.svc.ReplicaHealth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d replicas", len(got))
	}
	a, o := got[0], got[1]
	if a.ReplicaID != "replica-a" || a.Leased != 2 || a.Silent || !a.BackingOff || a.Reason == "" || a.Concurrency != payments.DefaultSweepConcurrency || a.LastSweepAt == nil {
		t.Fatalf("replica-a: %+v", a)
	}
	if o.ReplicaID != "replica-b" || o.Leased != 0 || !o.Silent || o.BackingOff {
		t.Fatalf("replica-b: %+v", o)
	}
}

// TestOpsCharts: the page's windows — 48 half hours and 96 quarter hours ending with the one
// under way, 60 minutes ending with this one — folded from the samples. o-paid settles at 11:59,
// but no patrol sampled 12:00: the first sample to see it committed is 12:01's, so it is in the
// 12:00 bar (a gap's settlements land where the gap ends; with a 12:00 sample it would be in
// 11:30's: TestSettledBarHoldsTheLastMinuteOfItsHalfHour). This test expected the 12:00 bar
// before too, when every sample's settled counts went to the bar of its own minute.
func TestOpsCharts(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.registered(t, "o-open", 100)
	b.sampleAt(t, b.plain, t0.Add(-25*time.Hour)) // outside the day
	b.sampleAt(t, b.plain, t0.Add(-23*time.Hour-20*time.Minute))
	b.sampleAt(t, b.plain, t0.Add(-time.Minute))
	b.completed(t, "o-paid", 100)
	b.sampleAt(t, b.plain, t0.Add(time.Minute))
	b.clock.Set(t0.Add(10*time.Minute + 5*time.Second))
	oc, err := b.svc.OpsCharts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(oc.States) != 48 || !oc.States[47].Start.Equal(t0) || !oc.States[0].Start.Equal(t0.Add(-23*time.Hour-30*time.Minute)) {
		t.Fatalf("state buckets: %d from %v to %v", len(oc.States), oc.States[0].Start, oc.States[len(oc.States)-1].Start)
	}
	if len(oc.Backlog) != 96 || !oc.Backlog[95].Start.Equal(t0) {
		t.Fatalf("backlog buckets: %d, last %v", len(oc.Backlog), oc.Backlog[len(oc.Backlog)-1].Start)
	}
	if len(oc.Gateway) != 60 || !oc.Gateway[59].Start.Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("gateway minutes: %d, last %v", len(oc.Gateway), oc.Gateway[len(oc.Gateway)-1].Start)
	}
	var sampled []int
	for i, s := range oc.States {
		if s.Sampled {
			sampled = append(sampled, i)
		}
	}
	if !slices.Equal(sampled, []int{0, 46, 47}) {
		t.Fatalf("sampled state buckets %v, want [0 46 47]", sampled)
	}
	if last := oc.States[47]; last.Active[payments.StatusRegistered] != 1 || last.Settled[payments.StatusCompleted] != 1 || !last.SettledSampled {
		t.Fatalf("the bucket under way (o-paid, counted at 12:01): %+v", last)
	}
	if b := oc.States[46]; b.Active[payments.StatusRegistered] != 1 || b.Settled[payments.StatusCompleted] != 0 || !b.SettledSampled ||
		oc.Latest == nil || !oc.Latest.At.Equal(t0.Add(time.Minute)) {
		t.Fatalf("11:30 bucket %+v, latest %+v", b, oc.Latest)
	}
}

// TestSettledBarHoldsTheLastMinuteOfItsHalfHour: docs/console.md, Operations: "Sessions settled —
// sessions that reached Completed, Failed, Canceled in each half hour". A session completed at
// 11:59:30 belongs to the 11:30–12:00 bar, not to 12:00–12:30. The sample of 12:00 counts what
// settled since 11:59's, and StateBuckets filed it by its At (12:00), so the last minute of every
// half hour landed in the next half hour's bar. Negative control: StateBuckets filing settled
// counts by At again — 11:30 bar completed=0, 12:00 bar completed=1.
func TestSettledBarHoldsTheLastMinuteOfItsHalfHour(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.sampleAt(t, b.plain, t0.Add(-2*time.Minute)) // 11:58: the patrol samples every minute
	b.sampleAt(t, b.plain, t0.Add(-time.Minute))   // 11:59
	b.clock.Set(t0.Add(-30 * time.Second))         // 11:59:30
	b.completed(t, "o-1159", 100)
	b.sampleAt(t, b.plain, t0.Add(5*time.Second))  // 12:00 (taken 12:00:05)
	b.sampleAt(t, b.plain, t0.Add(65*time.Second)) // 12:01
	b.clock.Set(t0.Add(10 * time.Minute))
	oc, err := b.svc.OpsCharts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before, after := oc.States[46], oc.States[47] // 11:30–12:00, 12:00–12:30
	if !before.Start.Equal(t0.Add(-30*time.Minute)) || !after.Start.Equal(t0) {
		t.Fatalf("bars start %s and %s", before.Start, after.Start)
	}
	if before.Settled[payments.StatusCompleted] != 1 || after.Settled[payments.StatusCompleted] != 0 {
		t.Fatalf("a session completed at 11:59:30: 11:30 bar completed=%d, 12:00 bar completed=%d (want 1 and 0)",
			before.Settled[payments.StatusCompleted], after.Settled[payments.StatusCompleted])
	}
	if !after.Sampled || after.Active[payments.StatusRegistered] != 0 {
		t.Fatalf("the 12:00 bar's stock is its samples' (12:00, 12:01): %+v", after)
	}
}

// TestStateAndBacklogBuckets: the folding itself — the last sample's stock, the summed flow,
// the backlog's peaks, samples outside the buckets ignored. A sample's settled counts are what
// settled before it, so they go to the bucket of the instant before its At: the sample at a
// bucket's start fills the previous bucket's settled bar (the one at 0 falls before the first
// bucket, the one at 90 min into the last), even one no sample was taken in (bucket 1). Before,
// this test expected them in the bucket of At.
func TestStateAndBacklogBuckets(t *testing.T) {
	t.Parallel()
	sample := func(at time.Duration, registered, completed, due, leased int, waiting time.Duration) payments.OpsSample {
		s := payments.OpsSample{At: t0.Add(at), TakenAt: t0.Add(at + 10*time.Second),
			Active:  map[payments.Status]int{payments.StatusRegistered: registered},
			Settled: map[payments.Status]int{payments.StatusCompleted: completed}, Due: due, Leased: leased, Flagged: registered}
		if waiting > 0 {
			d := s.TakenAt.Add(-waiting)
			s.OldestDueAt = &d
		}
		return s
	}
	samples := []payments.OpsSample{
		sample(-time.Minute, 50, 50, 50, 50, time.Hour), // before the first bucket
		sample(0, 5, 2, 3, 1, 0),
		sample(time.Minute, 7, 3, 9, 0, 40*time.Second),
		sample(29*time.Minute, 4, 1, 2, 6, 10*time.Second),
		sample(60*time.Minute, 1, 1, 0, 0, 0),
		sample(90*time.Minute, 99, 99, 99, 99, 0), // after the last
	}
	st := payments.StateBuckets(samples, t0, 30*time.Minute, 3)
	if !st[0].Sampled || !st[0].SettledSampled || st[0].Active[payments.StatusRegistered] != 4 || st[0].Settled[payments.StatusCompleted] != 4 {
		t.Fatalf("bucket 0: %+v", st[0])
	}
	if st[1].Sampled || !st[1].SettledSampled || st[1].Active[payments.StatusRegistered] != 0 || st[1].Settled[payments.StatusCompleted] != 1 ||
		!st[1].Start.Equal(t0.Add(30*time.Minute)) {
		t.Fatalf("bucket 1: %+v", st[1])
	}
	if !st[2].Sampled || !st[2].SettledSampled || st[2].Active[payments.StatusRegistered] != 1 || st[2].Settled[payments.StatusCompleted] != 99 {
		t.Fatalf("bucket 2: %+v", st[2])
	}
	bl := payments.BacklogBuckets(samples, t0, 30*time.Minute, 3)
	if !bl[0].Sampled || bl[0].Due != 9 || bl[0].Leased != 6 || bl[0].Flagged != 4 || bl[0].OldestDue != 40*time.Second {
		t.Fatalf("backlog 0: %+v", bl[0])
	}
	if bl[1].Sampled || bl[2].Due != 0 || !bl[2].Sampled {
		t.Fatalf("backlog 1, 2: %+v %+v", bl[1], bl[2])
	}
}
