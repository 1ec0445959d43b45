package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The Operations page's history (migration 00350): one sample per minute of the sessions by
// state and of the patrol's backlog, written by whichever replica's patrol comes first in the
// minute. The page's charts of the last 24 h read at most 1 440 of these rows instead of
// replaying session_events (millions of rows a day at a million sessions a day) on each view.

// OpsSampleEvery is the samples' resolution: one row per minute, at most.
const OpsSampleEvery = time.Minute

// OpsSampleRetention: samples older than this are reaped by the patrol's housekeeping. The page
// shows a day; three keep yesterday's comparison and a weekend's Monday morning question.
const OpsSampleRetention = 3 * 24 * time.Hour

// opsSampleLookback bounds how far back the previous sample is looked for when counting the
// sessions settled since it: after a gap longer than this (no replica's patrol ran), the first
// new sample counts the minute before it only, so one row never reads a day of events.
const opsSampleLookback = time.Hour

// opsSampleSQL writes the sample of minute $1 counted at $2 by replica $3 (SampleOps).
//
// The settled sessions are counted by the transaction that wrote their event, as the events feed
// reads (feed.go, migration 00210), not by created_at: created_at is when the apply read the
// clock, before it waited for its locks and committed, so a sample running in between missed the
// row and the next one, counting from its own minute, missed it too (migration 00660). x.xmin is
// the xmin of the statement's snapshot: every transaction below it has ended, so the events
// below it this snapshot sees are all there will ever be; a settlement still open has an id at
// or above it and is the next sample's. A sample counts the events with xid in [the previous
// sample's settled_xmin, x.xmin) — the previous sample being the latest within $4, as before.
// Without one, or when it has no settled_xmin (written by an older version during a rolling
// deploy), it counts as before from $1 - $5 or that sample's minute, by created_at (no upper
// bound: what this snapshot sees below x.xmin is this sample's, the next counts from x.xmin),
// below x.xmin.
//
// The two branches of s are guarded by whether p.after_xid is NULL, which references no column
// of session_events: PostgreSQL runs each guard as a one-time filter, and only one branch reads
// the table — the xid range through session_events_feed (xid, id), the fallback's minute through
// session_events_created (TestOpsChartQueriesUseIndexesAtScale). The xid range is what was
// written since the oldest transaction running at the previous sample: a transaction left open
// holds the counts back (as it holds the feed back) and the sample after it counts what it held.
var opsSampleSQL = `
	INSERT INTO ops_samples (at, taken_at, taken_by, registering, registered, unknown, authorized, canceling,
		flagged, due, oldest_due_at, leased, settled_since, settled_xmin, completed, failed, canceled)
	SELECT $1, $2, $3, a.registering, a.registered, a.unknown, a.authorized, a.canceling,
		a.flagged, a.due, a.oldest_due_at, a.leased, p.since, x.xmin, e.completed, e.failed, e.canceled
	FROM (
		SELECT count(*) FILTER (WHERE status = 'Registering') AS registering,
			count(*) FILTER (WHERE status = 'Registered') AS registered,
			count(*) FILTER (WHERE status = 'Unknown') AS unknown,
			count(*) FILTER (WHERE status = 'Authorized') AS authorized,
			count(*) FILTER (WHERE status = 'Canceling') AS canceling,
			count(*) FILTER (WHERE flagged_at IS NOT NULL) AS flagged,
			-- the sweeper's claim predicate (claimDue), as Stats counts it
			count(*) FILTER (WHERE next_check_at <= $2 AND flagged_at IS NULL AND (lease_until IS NULL OR lease_until <= $2)) AS due,
			min(next_check_at) FILTER (WHERE next_check_at <= $2 AND flagged_at IS NULL AND (lease_until IS NULL OR lease_until <= $2)) AS oldest_due_at,
			count(*) FILTER (WHERE lease_until > $2) AS leased
		FROM payment_sessions WHERE ` + activeStatusSQL + `
	) a,
	(SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin) x,
	(SELECT coalesce(prev.at, $1::timestamptz - $5::interval) AS since, prev.settled_xmin AS after_xid
		FROM (VALUES (1)) one LEFT JOIN (
			SELECT at, settled_xmin FROM ops_samples WHERE at < $1 AND at >= $1::timestamptz - $4::interval
			ORDER BY at DESC LIMIT 1) prev ON true) p,
	LATERAL (
		SELECT count(*) FILTER (WHERE s.ended AND s.to_status = 'Completed') AS completed,
			count(*) FILTER (WHERE s.ended AND s.to_status = 'Failed') AS failed,
			count(*) FILTER (WHERE s.ended AND s.to_status = 'Canceled') AS canceled
		FROM (
			SELECT to_status, true AS ended FROM session_events
			WHERE p.after_xid IS NOT NULL AND xid >= p.after_xid AND xid < x.xmin
				AND to_status IN ('Completed', 'Failed', 'Canceled')
			UNION ALL
			-- xid < x.xmin in the count, not here: as a condition the planner would read it as a
			-- range of session_events_feed from the first event ever
			SELECT to_status, xid < x.xmin FROM session_events
			WHERE p.after_xid IS NULL AND created_at >= p.since
				AND to_status IN ('Completed', 'Failed', 'Canceled')
		) s
	) e
	WHERE NOT EXISTS (SELECT 1 FROM ops_samples WHERE at >= $1)
	ON CONFLICT (at) DO NOTHING
	RETURNING true`

// SampleOps writes the sample of the current minute (by the service clock) unless it or a later
// one exists, and reports whether this call wrote it. When such a row exists, the NOT EXISTS
// guard is a primary-key range lookup and nothing is counted (PostgreSQL runs a constant WHERE
// as a one-time filter before the counts).
//
// Each sample counts the settlements since the latest sample before its minute, so two samples
// must never count from the same one: a minute's sample written after the next minute's (its
// replica read the clock at 12:00:59.8 and then waited for a connection), or two replicas
// sampling consecutive minutes at once (neither sees the other's row), both counted from 11:59
// and every settlement of that minute showed twice in the Operations page's bars, for the
// samples' three days (an outside review, numbers). Samplers take one advisory lock
// (LockOpsSample) before the statement, so its snapshot sees every sample written before it,
// and the guard drops a minute that a later sample already covered.
//
// Every count is bounded: the active sessions through the partial indexes over active states
// (migration 00310; the settled part of payment_sessions is never read), the settled ones from
// session_events over the transactions since the previous sample's snapshot through
// session_events_feed (opsSampleSQL; after a gap, the minute before through
// session_events_created).
func (s *Service) SampleOps(ctx context.Context) (bool, error) {
	now := s.cfg.Clock.Now()
	at := now.Truncate(OpsSampleEvery)
	err := s.inTx(ctx, "ops sample", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, 0)`, int32(LockOpsSample)); err != nil {
			return err
		}
		return tx.QueryRow(ctx, opsSampleSQL, at, now, s.cfg.ReplicaID, opsSampleLookback, OpsSampleEvery).Scan(new(bool))
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // this minute's sample, or a later one, exists (another replica, or this one, wrote it)
	}
	if err != nil {
		return false, fmt.Errorf("ops sample: %w", err)
	}
	return true, nil
}

// reapOpsSamples deletes samples older than OpsSampleRetention (by the primary key's order).
func (s *Service) reapOpsSamples(ctx context.Context) (int64, error) {
	tag, err := s.db.Exec(ctx, `DELETE FROM ops_samples WHERE at < $1`, s.cfg.Clock.Now().Add(-OpsSampleRetention))
	if err != nil {
		return 0, fmt.Errorf("reap ops samples: %w", err)
	}
	return tag.RowsAffected(), nil
}
