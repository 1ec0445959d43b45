package payments

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BeatNow writes this replica's heartbeat row now, as the patrol's ticker does during a round
// (for tests that read it mid-round).
func (s *Service) BeatNow(ctx context.Context) { s.beat(ctx) }

// ReconcileRound runs the patrol's reconciliation round once (RunSweeper's loop does it every
// ReconcileEvery), with the service's own configuration.
func (s *Service) ReconcileRound(ctx context.Context) { s.reconcileRound(ctx) }

// UpkeepBound is how long one housekeeping pass or one Operations sample may take.
func (s *Service) UpkeepBound() time.Duration { return s.upkeepBound() }

// SampleOpsAs runs one Operations sample's statement, as SampleOps does after its lock, in tx
// (a test's transaction standing for another replica's sampler).
func SampleOpsAs(ctx context.Context, tx interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, replica string, now time.Time) error {
	_, err := tx.Exec(ctx, opsSampleSQL, now.Truncate(OpsSampleEvery), now, replica, opsSampleLookback, OpsSampleEvery)
	return err
}

// LettingGo is how many holds s is letting go of in the background right now (letGoLater).
func LettingGo(s *Service) int { return len(s.lettingGo) }

// ConfirmDurable is confirmDurable on db (a pool of any database: it touches no table).
func ConfirmDurable(ctx context.Context, db *pgxpool.Pool) error { return confirmDurable(ctx, db) }

// ConfirmDurableSQL is the statement confirmDurable commits.
const ConfirmDurableSQL = confirmDurableSQL
