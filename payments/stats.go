package payments

import (
	"context"
	"fmt"
)

// Stats are the counts an operator watches (metrics, console): sessions by status, sessions the
// sweeper gave up on, open finance cases by kind, and webhook events not (yet) processed.
type Stats struct {
	Sessions          map[Status]int // every status present, zero when none
	FlaggedSessions   int
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
	rows, err := s.db.Query(ctx, `SELECT status, count(*) FROM payment_sessions GROUP BY status`)
	if err != nil {
		return Stats{}, fmt.Errorf("stats: sessions: %w", err)
	}
	for rows.Next() {
		var status string
		var n int
		if err := rows.Scan(&status, &n); err != nil {
			rows.Close()
			return Stats{}, fmt.Errorf("stats: sessions: %w", err)
		}
		st.Sessions[Status(status)] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("stats: sessions: %w", err)
	}

	rows, err = s.db.Query(ctx, `SELECT kind, count(*) FROM finance_cases WHERE resolved_at IS NULL GROUP BY kind`)
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

	if err := s.db.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM payment_sessions WHERE flagged_at IS NOT NULL AND status = ANY($1)),
		(SELECT count(*) FROM webhook_events WHERE processed_at IS NULL)`, statusStrings(ActiveStatuses)).
		Scan(&st.FlaggedSessions, &st.UnprocessedEvents); err != nil {
		return Stats{}, fmt.Errorf("stats: flagged: %w", err)
	}
	return st, nil
}
