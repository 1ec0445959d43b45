package payments

import (
	"context"
	"fmt"
	"time"
)

// Stats are the counts an operator watches (metrics, console): sessions by status, sessions the
// sweeper gave up on, the sweeper's backlog, open finance cases by kind, and webhook events not
// (yet) processed.
type Stats struct {
	Sessions        map[Status]int // every status present, zero when none
	FlaggedSessions int
	// DueSessions are active sessions whose next look is due and that no live lease covers: the
	// sweepers' backlog. OldestDue is how overdue the oldest of them is (0 when none): if it
	// grows, no replica is sweeping.
	DueSessions       int
	OldestDue         time.Duration
	LeasedSessions    int // sessions a sweeper holds right now
	OpenCases         map[string]int
	UnprocessedEvents int
}

// Stats counts with aggregate queries (each a scan of an index or a small table); callers bound
// the time with ctx. The counts are of the whole database, not of this replica.
func (s *Service) Stats(ctx context.Context) (Stats, error) {
	st := Stats{Sessions: make(map[Status]int, len(AllStatuses)), OpenCases: map[string]int{}}
	for _, a := range AllStatuses {
		st.Sessions[a] = 0
	}
	counts, err := s.StatusCounts(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("stats: %w", err)
	}
	for st2, n := range counts {
		st.Sessions[st2] = n
	}

	rows, err := s.db.Query(ctx, `SELECT kind, count(*) FROM finance_cases WHERE resolved_at IS NULL GROUP BY kind`)
	if err != nil {
		return Stats{}, fmt.Errorf("stats: cases: %w", err)
	}
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			rows.Close()
			return Stats{}, fmt.Errorf("stats: cases: %w", err)
		}
		st.OpenCases[kind] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("stats: cases: %w", err)
	}

	// The same predicate as the sweeper's claim (claimDue), so "due" means what it means there.
	var oldest *time.Time
	now := s.cfg.Clock.Now()
	if err := s.db.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM payment_sessions WHERE flagged_at IS NOT NULL AND status = ANY($1)),
		(SELECT count(*) FROM payment_sessions WHERE status = ANY($1) AND next_check_at <= $2 AND flagged_at IS NULL
			AND (lease_until IS NULL OR lease_until <= $2)),
		(SELECT min(next_check_at) FROM payment_sessions WHERE status = ANY($1) AND next_check_at <= $2 AND flagged_at IS NULL
			AND (lease_until IS NULL OR lease_until <= $2)),
		(SELECT count(*) FROM payment_sessions WHERE `+activeStatusSQL+` AND lease_until > $2),
		(SELECT count(*) FROM webhook_events WHERE processed_at IS NULL)`, statusStrings(ActiveStatuses), now).
		Scan(&st.FlaggedSessions, &st.DueSessions, &oldest, &st.LeasedSessions, &st.UnprocessedEvents); err != nil {
		return Stats{}, fmt.Errorf("stats: sweeper: %w", err)
	}
	if oldest != nil && now.After(*oldest) {
		st.OldestDue = now.Sub(*oldest)
	}
	return st, nil
}

// statusDeltaFold is how many delta rows StatusCounts lets pile up before it folds them.
const statusDeltaFold = 1000

// StatusCounts returns how many sessions are in each status present, exactly, without counting
// payment_sessions: it sums the deltas its trigger appends (migration 00021), and when more
// than statusDeltaFold rows have piled up folds them into one row per status (one statement:
// the rows it deletes are the rows it sums, so nothing is lost or counted twice, whoever folds
// at the same time).
func (s *Service) StatusCounts(ctx context.Context) (map[Status]int, error) {
	rows, err := s.db.Query(ctx, `SELECT status, sum(delta), count(*) FROM session_status_deltas GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("status counts: %w", err)
	}
	counts := map[Status]int{}
	pending := 0
	for rows.Next() {
		var status string
		var n, k int
		if err := rows.Scan(&status, &n, &k); err != nil {
			rows.Close()
			return nil, fmt.Errorf("status counts: %w", err)
		}
		if n != 0 {
			counts[Status(status)] = n
		}
		pending += k
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("status counts: %w", err)
	}
	if pending > statusDeltaFold {
		if _, err := s.db.Exec(ctx, `WITH gone AS (DELETE FROM session_status_deltas RETURNING status, delta)
			INSERT INTO session_status_deltas (status, delta) SELECT status, sum(delta) FROM gone GROUP BY status`); err != nil {
			return nil, fmt.Errorf("status counts: fold: %w", err)
		}
	}
	return counts, nil
}
