package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultBackoff is the sweeper's schedule: how long after its n-th look the n+1-th comes.
// Seconds at first (a lost answer is usually found quickly), then minutes, then hours — about
// three days in all. When it runs out the session is flagged for finance; time alone never
// fails a payment, because a timeout never proves a payment did not happen.
var DefaultBackoff = []time.Duration{
	5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
	3 * time.Minute, 5 * time.Minute, 10 * time.Minute, 20 * time.Minute, 40 * time.Minute,
	time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 12 * time.Hour, 24 * time.Hour, 24 * time.Hour,
}

// SweepOnce is one round of the night patrol on this replica: it claims due sessions in short
// transactions (FOR UPDATE SKIP LOCKED, so replicas never wait for or double-take each other's
// rows), sets a lease, commits, and only then drives each one against the gateway with no lock
// held. It repeats until nothing is due and returns how many sessions it drove.
func (s *Service) SweepOnce(ctx context.Context) (int, error) {
	total := 0
	for range 1000 { // bounded: each claimed session is rescheduled into the future
		batch, err := s.claimDue(ctx)
		if err != nil {
			return total, err
		}
		if len(batch) == 0 {
			return total, nil
		}
		if h := s.cfg.Hooks.AfterSweepClaim; h != nil {
			ids := make([]string, len(batch))
			for i, b := range batch {
				ids[i] = b.ID
			}
			h(ctx, ids)
		}
		for _, sess := range batch {
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
			s.drive(ctx, sess)
			if err := s.release(ctx, sess.ID); err != nil {
				return total, err
			}
			total++
		}
	}
	return total, nil
}

// claimDue leases up to SweepBatch due sessions to this replica. A lease that expired (its
// replica died) is as good as free; a live one is skipped.
func (s *Service) claimDue(ctx context.Context) ([]Session, error) {
	now := s.cfg.Clock.Now()
	var out []Session
	err := s.inTx(ctx, "sweep: claim", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			WITH due AS (
				SELECT id AS due_id FROM payment_sessions
				WHERE status = ANY($1) AND next_check_at <= $2 AND flagged_at IS NULL
				  AND (lease_until IS NULL OR lease_until <= $2)
				ORDER BY next_check_at
				LIMIT $3
				FOR UPDATE SKIP LOCKED
			)
			UPDATE payment_sessions ps SET lease_owner = $4, lease_until = $5
			FROM due WHERE ps.id = due.due_id
			RETURNING `+sessionColumns,
			statusStrings(ActiveStatuses), now, s.cfg.SweepBatch, s.cfg.ReplicaID, now.Add(s.cfg.LeaseDuration))
		if err != nil {
			return fmt.Errorf("sweep: claim: %w", err)
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) { return scanSession(r) })
		return err
	})
	return out, err
}

// drive moves one leased session as far as the gateway's word allows.
func (s *Service) drive(ctx context.Context, sess Session) {
	actor := Actor{Kind: ActorSweeper, ID: s.cfg.ReplicaID}
	var err error
	switch sess.Status {
	case StatusCanceling:
		var pending bool
		if err = s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM reverse_operations WHERE session_id = $1 AND status = 'Pending')`, sess.ID).Scan(&pending); err == nil {
			if pending {
				_, err = s.driveReverse(ctx, actor, sess)
			} else {
				_, err = s.Check(ctx, actor, sess.ID)
			}
		}
	case StatusRegistering, StatusUnknown:
		if sess.GatewayPaymentID != "" {
			_, err = s.Check(ctx, actor, sess.ID)
			break
		}
		// Recover a registration whose answer never came: look it up by our reference first
		// (a gateway that cannot be trusted with keys must not get a second request), and only
		// when the gateway has nothing, register again with the same key.
		var gp GatewayPayment
		var found bool
		gp, found, err = s.gatewayState(ctx, sess)
		if err == nil && found {
			_, err = s.applyGatewayPayment(ctx, actor, sess.ID, gp, "found by reference")
		} else if err == nil {
			if sess.Status == StatusUnknown {
				// register() applies failures from Registering only; an Unknown session is
				// re-registered through the same key and its success applied the same way.
				started := time.Now()
				req := RegisterRequest{IdempotencyKey: sess.ID, Reference: sess.Reference(), Amount: sess.Amount,
					Currency: sess.Currency, ReturnURL: s.cfg.ReturnURL(sess)}
				gp, err = s.gw.Register(ctx, req)
				s.logGatewayCall(ctx, sess.ID, "register", req.IdempotencyKey, started, err)
				if err == nil {
					_, err = s.applyGatewayPayment(ctx, actor, sess.ID, gp, "registered again with the same key")
				}
			} else {
				_, err = s.register(ctx, actor, sess)
			}
		}
	default:
		_, err = s.Check(ctx, actor, sess.ID)
	}
	if err != nil {
		s.log.Info("sweep: session not settled this round", "session", sess.ID, "status", sess.Status, "err", err)
	}
}

// release gives up this replica's lease and schedules the next look, or flags the session for
// finance when the schedule ran out.
func (s *Service) release(ctx context.Context, id string) error {
	ctx = context.WithoutCancel(ctx)
	now := s.cfg.Clock.Now()
	return s.inTx(ctx, "sweep: release", func(tx pgx.Tx) error {
		var status string
		var attempts int
		var orderID string
		err := tx.QueryRow(ctx, `SELECT status, check_attempts, order_id FROM payment_sessions WHERE id = $1 AND lease_owner = $2 FOR UPDATE`,
			id, s.cfg.ReplicaID).Scan(&status, &attempts, &orderID)
		if err == pgx.ErrNoRows {
			return nil // lease taken over after expiry: the other replica owns the schedule now
		}
		if err != nil {
			return fmt.Errorf("sweep: release: %w", err)
		}
		attempts++
		if Status(status).Terminal() {
			_, err = tx.Exec(ctx, `UPDATE payment_sessions SET lease_owner = NULL, lease_until = NULL,
				check_attempts = $2, next_check_at = NULL WHERE id = $1`, id, attempts)
			return err
		}
		if attempts >= len(s.cfg.Backoff) {
			reason := fmt.Sprintf("no final answer from the gateway after %d looks; still %s", attempts, status)
			if _, err := tx.Exec(ctx, `UPDATE payment_sessions SET lease_owner = NULL, lease_until = NULL,
				check_attempts = $2, next_check_at = NULL, flagged_at = $3, flag_reason = $4 WHERE id = $1`,
				id, attempts, now, reason); err != nil {
				return err
			}
			return openCase(ctx, tx, id, orderID, CaseSweepExhausted, reason, now)
		}
		_, err = tx.Exec(ctx, `UPDATE payment_sessions SET lease_owner = NULL, lease_until = NULL,
			check_attempts = $2, next_check_at = $3 WHERE id = $1`, id, attempts, now.Add(s.cfg.Backoff[attempts]))
		return err
	})
}

// ReleaseLeases gives back every lease this replica holds (graceful shutdown), so other replicas
// need not wait for them to expire.
func (s *Service) ReleaseLeases(ctx context.Context) error {
	_, err := s.db.Exec(ctx, `UPDATE payment_sessions SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = $1`, s.cfg.ReplicaID)
	if err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

// HousekeepingEvery is how often (by the service clock) a replica's patrol also reaps expired
// idempotency keys and old checkout intents. Every
// replica may do it: the deletes are batched and skip rows another replica holds.
const HousekeepingEvery = 5 * time.Minute

// housekeep deletes what has expired, in bounded batches.
func (s *Service) housekeep(ctx context.Context) {
	if n, err := s.ReapIdempotencyKeys(ctx, s.cfg.Clock.Now(), 1000); err != nil {
		s.log.Error("reap idempotency keys", "err", err)
	} else if n > 0 {
		s.log.Info("reaped idempotency keys", "count", n)
	}
	if _, err := s.ReapCheckoutIntents(ctx); err != nil {
		s.log.Error("reap checkout intents", "err", err)
	}
}

// RunSweeper runs the patrol every interval until ctx ends, then releases this replica's leases:
// due sessions (SweepOnce), undelivered customer messages, pending refunds, every
// HousekeepingEvery the reapers, and every ReconcileEvery a reconciliation run (reconcile.go) if
// this replica leads it; on shutdown it also gives up that leadership.
func (s *Service) RunSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastHousekeeping, lastReconcile time.Time
	for {
		if now := s.cfg.Clock.Now(); now.Sub(lastHousekeeping) >= HousekeepingEvery {
			s.housekeep(ctx)
			lastHousekeeping = now
		}
		if _, err := s.SweepOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("sweep", "err", err)
		}
		if _, err := s.DeliverOutbox(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("outbox", "err", err)
		}
		if _, err := s.DriveRefunds(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("refunds", "err", err)
		}
		if now := s.cfg.Clock.Now(); now.Sub(lastReconcile) >= ReconcileEvery {
			s.reconcileRound(ctx) // only the leader compares; the others try for the leader row
			lastReconcile = now
		}
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := s.ReleaseLeases(rctx); err != nil {
				s.log.Error("sweep: release leases on shutdown", "err", err)
			}
			s.releaseLeadershipOnShutdown(rctx)
			cancel()
			return
		case <-t.C:
		}
	}
}
