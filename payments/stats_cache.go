package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// CachedStats returns Stats as counted at most maxAge ago (by the service clock) by whichever
// replica counted last, so that the scrapes of every replica's /metrics within maxAge cost one
// count between them, not one each. The scrape that finds the stored counts too old claims the
// row (a guarded UPDATE that skips a row another scrape holds), counts and stores in the same
// transaction; a scrape that arrives meanwhile gets the previous counts at once instead of
// waiting.
//
// The counts go through the claim's transaction, on the connection it holds, not through the
// pool: counting through the pool needed a second connection while the claim held the first, so
// on a pool of one connection (pool_max_conns=1) the scrape waited for itself until its deadline,
// pitlane_stats_up was 0 on a healthy database, and the replica's only connection sat idle in a
// transaction meanwhile (an outside review). Counting first and claiming after would need no
// second connection either, but then every scrape that found the counts old would count, not one.
func (s *Service) CachedStats(ctx context.Context, maxAge time.Duration) (Stats, error) {
	now := s.cfg.Clock.Now()
	var st Stats
	counted := false
	err := s.inTx(ctx, "cached stats", func(tx pgx.Tx) error {
		var claimed bool
		// Counted in the future: the database's clock stepped back since (a failover to a standby
		// with another clock, an NTP step). Such counts are not fresh, they are of unknown age:
		// counted again, or every scrape served them as current until the clock caught up (an
		// outside review).
		err := tx.QueryRow(ctx, `UPDATE stats_cache SET refreshed_at = $1
			WHERE id = (SELECT id FROM stats_cache WHERE id = 1 AND (refreshed_at <= $2 OR refreshed_at > $1) FOR UPDATE SKIP LOCKED)
			RETURNING true`, now, now.Add(-maxAge)).Scan(&claimed)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // fresh enough, or being counted right now: read what is stored
		}
		if err != nil {
			return fmt.Errorf("cached stats: claim: %w", err)
		}
		if st, err = s.countStats(ctx, tx); err != nil {
			return err
		}
		b, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("cached stats: encode: %w", err)
		}
		// As text: a []byte goes as bytea in the exec and simple protocols (pgbouncer's transaction
		// pooling, docs/operations.md), which jsonb refuses (an outside review: every scrape's
		// database counts failed there).
		if _, err := tx.Exec(ctx, `UPDATE stats_cache SET stats = $1::text::jsonb WHERE id = 1`, string(b)); err != nil {
			return fmt.Errorf("cached stats: store: %w", err)
		}
		counted = true
		return nil
	})
	if err != nil || counted {
		return st, err
	}
	var b []byte
	if err := s.db.QueryRow(ctx, `SELECT stats FROM stats_cache WHERE id = 1`).Scan(&b); err != nil {
		return Stats{}, fmt.Errorf("cached stats: read: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return Stats{}, fmt.Errorf("cached stats: decode: %w", err)
	}
	if st.Sessions == nil {
		return Stats{}, errors.New("cached stats: not counted yet (the first count is running)")
	}
	st.ofGateway(s.gatewayName()) // the counts are of whichever replica counted last
	// The stored counts are as old as the last count that finished. Another scrape recounting
	// right now holds the row: while the database counts slowly (its counts time out and roll
	// back), those counts grow old, and handing them out as current froze every gauge on them
	// and answered pitlane_stats_up 1 to the scrapes that should have told of the outage (an
	// outside review). Beyond a few ages, this scrape has no counts to give.
	if age := now.Sub(st.CountedAt); st.CountedAt.IsZero() || age > staleStatsAfter*maxAge {
		return Stats{}, fmt.Errorf("cached stats: the last counts are %s old and a recount is running (the database counts slowly)", age.Round(time.Second))
	}
	return st, nil
}

// staleStatsAfter is how many maxAges old the stored counts may be when a recount is running: one
// for the counts themselves, the rest for the recount in flight.
const staleStatsAfter = 3
