package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Read models of the Operations page (/ops): the sessions by state and the patrol's backlog over
// the last day (from ops_samples, ops_samples.go), the gateway's calls per minute with their
// latency (from gateway_calls), and each replica's patrol (from sweeper_heartbeats). Every query
// reads a bounded time range through an index, or the active sessions through the partial
// indexes over active states: none reads payment_sessions, session_events or gateway_calls whole
// (TestOpsChartQueriesUseIndexesAtScale checks the plans).

// The windows and resolutions the page draws.
const (
	OpsHistory       = 24 * time.Hour   // sessions by state, settled, backlog
	OpsStateBucket   = 30 * time.Minute // 48 bars of sessions by state and settled
	OpsBacklogBucket = 15 * time.Minute // 96 points of the backlog
	OpsGatewayWindow = time.Hour        // 60 minutes of gateway calls
	OpsGatewayMinute = time.Minute
	// ReplicaSilentAfter: a replica whose patrol has not written its heartbeat for this long is
	// shown as silent. A patrol beats every round and every SWEEP_INTERVAL during a long one
	// (default 2 s), so a minute of silence is a dead process or a stuck database connection.
	ReplicaSilentAfter = time.Minute
	// ReplicaNotSweepingAfter: a replica that beats but has not looked for due work for this
	// long, and is not backing off, is not sweeping (its drives hang): what
	// PitlaneReplicaNotSweeping fires on (deploy/prometheus/pitlane.rules.yml, 120 s).
	ReplicaNotSweepingAfter = 2 * time.Minute
)

// GatewayOutcome is how a gateway call ended (gateway_calls.outcome): "ok", or the FailureKind.
type GatewayOutcome string

const GatewayOK GatewayOutcome = "ok"

// GatewayOutcomes in the order the page stacks them.
var GatewayOutcomes = []GatewayOutcome{GatewayOK, GatewayOutcome(FailureDefinitive), GatewayOutcome(FailureUnknown),
	GatewayOutcome(FailureNotSent)}

// SettledStatuses are the terminal states, in the order the page stacks them.
var SettledStatuses = []Status{StatusCompleted, StatusFailed, StatusCanceled}

// OpsSample is one row of ops_samples: a minute's counts.
type OpsSample struct {
	At          time.Time // the minute it stands for
	TakenAt     time.Time // when it was counted, within that minute
	Active      map[Status]int
	Flagged     int
	Due         int
	OldestDueAt *time.Time
	Leased      int
	// Settled counts the sessions that reached each terminal state in transactions this sample
	// saw ended and the previous one did not (ops_samples.settled_xmin, opsSampleSQL): each
	// settlement once, by when its commit was sampled. SettledSince is the previous sample's
	// minute (the minute before At when there was none within an hour): the counts are mostly
	// the settlements of [SettledSince, At), plus any that committed late.
	SettledSince time.Time
	Settled      map[Status]int
}

// StateBucket is one bar of "sessions by state": the active sessions at the bucket's last
// sample (a stock: how many were in flight then) and the sessions settled during the bucket (a
// flow: the sum of the settled counts filed in it, StateBuckets). Sampled is false when no
// replica's patrol ran in it; SettledSampled when no sample's settled counts were filed in it.
type StateBucket struct {
	Start          time.Time
	Sampled        bool
	SettledSampled bool
	Active         map[Status]int
	Settled        map[Status]int
}

// BacklogBucket is one point of the patrol's backlog: the most due sessions, the most leased and
// the longest-waiting due look seen at any sample of the bucket (peaks are what matter: a
// backlog that drains between samples is healthy).
type BacklogBucket struct {
	Start     time.Time
	Sampled   bool
	Due       int
	Leased    int
	Flagged   int // at the bucket's last sample
	OldestDue time.Duration
}

// GatewayMinute is one minute of gateway calls: how many by outcome, and the median and 95th
// percentile latency of the calls that reached the gateway (not_sent ones took no round trip).
type GatewayMinute struct {
	Start    time.Time
	Calls    map[GatewayOutcome]int
	Total    int
	P50, P95 *float64 // milliseconds; nil when no call was sent that minute
}

// ReplicaHealth is one replica's patrol: its heartbeat, the sessions leased to it right now,
// and how it is doing.
type ReplicaHealth struct {
	Heartbeat
	Leased int  // active sessions whose unexpired lease names this replica
	Silent bool // no heartbeat for ReplicaSilentAfter
	// NotSweeping: it beats, but its last look for due work is older than
	// ReplicaNotSweepingAfter and it is not backing off (the alert's rule).
	NotSweeping bool
	BackingOff  bool
	Probing     bool // its back-off ran out and it probes the gateway (BackingOff too)
}

// OpsCharts is everything the Operations page draws, as of At.
type OpsCharts struct {
	At       time.Time
	States   []StateBucket   // OpsHistory in OpsStateBucket steps, oldest first
	Backlog  []BacklogBucket // OpsHistory in OpsBacklogBucket steps, oldest first
	Gateway  []GatewayMinute // OpsGatewayWindow in minutes, oldest first, the current minute last
	Replicas []ReplicaHealth // by replica id
	Latest   *OpsSample      // the newest sample of the day (nil: none yet)
	Webhook  EventsWebhookState
}

// OpsCharts reads the Operations page's figures. Buckets end at the current one: the last bar
// is the bucket now under way.
func (s *Service) OpsCharts(ctx context.Context) (OpsCharts, error) {
	now := s.cfg.Clock.Now()
	oc := OpsCharts{At: now}
	stateFrom := now.Truncate(OpsStateBucket).Add(-OpsHistory + OpsStateBucket)
	backlogFrom := now.Truncate(OpsBacklogBucket).Add(-OpsHistory + OpsBacklogBucket)
	from := stateFrom
	if backlogFrom.Before(from) {
		from = backlogFrom
	}
	samples, err := s.OpsSamples(ctx, from, now)
	if err != nil {
		return OpsCharts{}, err
	}
	oc.States = StateBuckets(samples, stateFrom, OpsStateBucket, int(OpsHistory/OpsStateBucket))
	oc.Backlog = BacklogBuckets(samples, backlogFrom, OpsBacklogBucket, int(OpsHistory/OpsBacklogBucket))
	if len(samples) > 0 {
		oc.Latest = &samples[len(samples)-1]
	}
	gwFrom := now.Truncate(OpsGatewayMinute).Add(-OpsGatewayWindow + OpsGatewayMinute)
	if oc.Gateway, err = s.GatewayMinutes(ctx, gwFrom, now); err != nil {
		return OpsCharts{}, err
	}
	if oc.Replicas, err = s.ReplicaHealth(ctx); err != nil {
		return OpsCharts{}, err
	}
	if oc.Webhook, err = s.EventsWebhookStatus(ctx); err != nil {
		return OpsCharts{}, err
	}
	return oc, nil
}

// opsSamplesSQL reads samples in [$1, $2]: a range of the primary key.
const opsSamplesSQL = `SELECT at, taken_at, registering, registered, unknown, authorized, canceling, flagged, due, oldest_due_at, leased,
	settled_since, completed, failed, canceled
	FROM ops_samples WHERE at >= $1 AND at <= $2 ORDER BY at`

// OpsSamples returns the samples of [from, to], oldest first.
func (s *Service) OpsSamples(ctx context.Context, from, to time.Time) ([]OpsSample, error) {
	rows, err := s.db.Query(ctx, opsSamplesSQL, from, to)
	if err != nil {
		return nil, fmt.Errorf("ops samples: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpsSample, error) {
		var o OpsSample
		var reg, regd, unk, auth, canc, comp, fail, cancd int
		err := r.Scan(&o.At, &o.TakenAt, &reg, &regd, &unk, &auth, &canc, &o.Flagged, &o.Due, &o.OldestDueAt, &o.Leased,
			&o.SettledSince, &comp, &fail, &cancd)
		o.Active = map[Status]int{StatusRegistering: reg, StatusRegistered: regd, StatusUnknown: unk,
			StatusAuthorized: auth, StatusCanceling: canc}
		o.Settled = map[Status]int{StatusCompleted: comp, StatusFailed: fail, StatusCanceled: cancd}
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("ops samples: %w", err)
	}
	return out, nil
}

// bucketOf returns the index of the bucket of width step starting at from that t falls in, or
// -1 outside the n buckets.
func bucketOf(t, from time.Time, step time.Duration, n int) int {
	if t.Before(from) {
		return -1
	}
	i := int(t.Sub(from) / step)
	if i >= n {
		return -1
	}
	return i
}

// foldSamples folds samples (oldest first) into n buckets of step from from: each bucket made
// by newBucket for its start, then add called with every sample that falls in it, in order.
// Samples outside the buckets are left out.
func foldSamples[B any](samples []OpsSample, from time.Time, step time.Duration, n int,
	newBucket func(start time.Time) B, add func(b *B, o OpsSample)) []B {
	out := make([]B, n)
	for i := range out {
		out[i] = newBucket(from.Add(time.Duration(i) * step))
	}
	for _, o := range samples {
		if i := bucketOf(o.At, from, step, n); i >= 0 {
			add(&out[i], o)
		}
	}
	return out
}

// StateBuckets folds samples (oldest first) into n buckets of step from from: the active counts
// of each bucket's last sample, the settled counts summed.
//
// A sample's active counts are the stock at its At, in At's bucket. Its settled counts are the
// settlements since the previous sample (OpsSample.Settled), mostly of the minute before At, so
// they are filed in the bucket of the instant just before At: the sample of 12:00 holds what
// settled in 11:59 and belongs to the 11:30 bar, not to 12:00's. A gap's settlements land in
// the bucket where the gap ends — which may be one no sample falls in (SettledSampled without
// Sampled).
func StateBuckets(samples []OpsSample, from time.Time, step time.Duration, n int) []StateBucket {
	out := foldSamples(samples, from, step, n, func(start time.Time) StateBucket {
		return StateBucket{Start: start, Active: map[Status]int{}, Settled: map[Status]int{}}
	}, func(b *StateBucket, o OpsSample) {
		b.Sampled = true
		for _, st := range ActiveStatuses {
			b.Active[st] = o.Active[st] // samples come oldest first: the last one stays
		}
	})
	for _, o := range samples {
		if i := bucketOf(o.At.Add(-time.Nanosecond), from, step, n); i >= 0 {
			out[i].SettledSampled = true
			for _, st := range SettledStatuses {
				out[i].Settled[st] += o.Settled[st]
			}
		}
	}
	return out
}

// BacklogBuckets folds samples (oldest first) into n buckets of step from from: the peaks of
// each bucket, and its last flagged count.
func BacklogBuckets(samples []OpsSample, from time.Time, step time.Duration, n int) []BacklogBucket {
	return foldSamples(samples, from, step, n, func(start time.Time) BacklogBucket {
		return BacklogBucket{Start: start}
	}, func(b *BacklogBucket, o OpsSample) {
		b.Sampled = true
		b.Due = max(b.Due, o.Due)
		b.Leased = max(b.Leased, o.Leased)
		b.Flagged = o.Flagged
		if o.OldestDueAt != nil {
			b.OldestDue = max(b.OldestDue, o.TakenAt.Sub(*o.OldestDueAt))
		}
	})
}

// gatewayMinutesSQL counts the calls of [$1, $2] per minute and outcome, and the latency
// percentiles per minute (the grouping set without the outcome), through gateway_calls_created
// (an index-only scan: created_at INCLUDE outcome, latency_ms).
const gatewayMinutesSQL = `SELECT minute, outcome, GROUPING(outcome) = 1, count(*),
	percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) FILTER (WHERE outcome <> 'not_sent'),
	percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) FILTER (WHERE outcome <> 'not_sent')
	FROM (SELECT date_bin('1 minute', created_at, $1::timestamptz) AS minute, outcome, latency_ms
		FROM gateway_calls WHERE created_at >= $1 AND created_at <= $2) c
	GROUP BY GROUPING SETS ((minute, outcome), (minute))
	ORDER BY minute`

// GatewayMinutes counts the gateway calls from from (a minute's start) up to and including to
// (now: the minute under way is the last), per minute and outcome, with the median and 95th
// percentile latency of each minute. Every minute of the range is in the result, empty ones
// included.
func (s *Service) GatewayMinutes(ctx context.Context, from, to time.Time) ([]GatewayMinute, error) {
	n := 0
	if !to.Before(from) {
		n = int(to.Sub(from)/OpsGatewayMinute) + 1
	}
	out := make([]GatewayMinute, n)
	for i := range out {
		out[i] = GatewayMinute{Start: from.Add(time.Duration(i) * OpsGatewayMinute), Calls: map[GatewayOutcome]int{}}
	}
	rows, err := s.db.Query(ctx, gatewayMinutesSQL, from, to)
	if err != nil {
		return nil, fmt.Errorf("gateway minutes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var minute time.Time
		var outcome *string
		var all bool
		var count int
		var p50, p95 *float64
		if err := rows.Scan(&minute, &outcome, &all, &count, &p50, &p95); err != nil {
			return nil, fmt.Errorf("gateway minutes: %w", err)
		}
		i := bucketOf(minute, from, OpsGatewayMinute, len(out))
		if i < 0 {
			continue
		}
		if all {
			out[i].Total, out[i].P50, out[i].P95 = count, p50, p95
		} else if outcome != nil {
			out[i].Calls[GatewayOutcome(*outcome)] = count
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("gateway minutes: %w", err)
	}
	return out, nil
}

// replicaLeasesSQL counts the unexpired leases per owner over the active sessions (a lease is
// only ever taken on an active session, and released when its drive ends), through the partial
// indexes over active states.
var replicaLeasesSQL = `SELECT lease_owner, count(*) FROM payment_sessions
	WHERE ` + activeStatusSQL + ` AND lease_until > $1 AND lease_owner IS NOT NULL GROUP BY lease_owner`

// ReplicaHealth lists every replica's patrol from its heartbeat row, with the sessions leased to
// it right now.
func (s *Service) ReplicaHealth(ctx context.Context) ([]ReplicaHealth, error) {
	now := s.cfg.Clock.Now()
	hbs, err := s.Heartbeats(ctx)
	if err != nil {
		return nil, fmt.Errorf("replica health: %w", err)
	}
	rows, err := s.db.Query(ctx, replicaLeasesSQL, now)
	if err != nil {
		return nil, fmt.Errorf("replica health: leases: %w", err)
	}
	leased := map[string]int{} // bounded by the replicas holding leases right now
	for rows.Next() {
		var owner string
		var n int
		if err := rows.Scan(&owner, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("replica health: leases: %w", err)
		}
		leased[owner] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("replica health: leases: %w", err)
	}
	out := make([]ReplicaHealth, len(hbs))
	for i, h := range hbs {
		out[i] = ReplicaHealth{Heartbeat: h, Leased: leased[h.ReplicaID],
			Silent: now.Sub(h.BeatAt) >= ReplicaSilentAfter, BackingOff: h.BackingOff(now), Probing: h.Probing(now)}
		out[i].NotSweeping = h.LastSweepAt != nil && now.Sub(*h.LastSweepAt) > ReplicaNotSweepingAfter && !out[i].BackingOff
	}
	return out, nil
}
