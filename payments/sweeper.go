package payments

import (
	"context"
	"errors"
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

// SweepOnce is one round of the night patrol over due sessions on this replica (patrol.go): it
// claims due sessions in short transactions (FOR UPDATE SKIP LOCKED, a lease with a fresh token
// each), as many as it has free workers, drives up to SweepConcurrency of them at once against
// the gateway with no lock held, claims more as drives finish, and returns how many it drove once
// nothing is due. While the patrol backs off (the gateway failing) it drives nothing.
func (s *Service) SweepOnce(ctx context.Context) (int, error) {
	rep, err := s.runRound(ctx, []patrolSource{s.sessionSource()}, nil, 0)
	return rep.Driven, err
}

// sessionSource is the patrol's work on sessions: due active sessions, not flagged, whose lease
// (if any) ran out.
func (s *Service) sessionSource() patrolSource {
	return patrolSource{kind: "session", gateway: true, leases: &sessionLeases, claim: func(ctx context.Context, limit int) ([]patrolJob, error) {
		claimed, err := s.claimDue(ctx, limit)
		if err != nil {
			return nil, err
		}
		jobs := make([]patrolJob, len(claimed))
		for i, c := range claimed {
			jobs[i] = patrolJob{id: c.sess.ID, token: c.token, leasedAt: c.leasedAt, run: func(ctx context.Context) driveEnd { return s.driveLeased(ctx, c.sess, c.token) }}
		}
		return jobs, nil
	}}
}

type leasedSession struct {
	sess     Session
	token    string
	leasedAt time.Time // the claim's time: the lease runs until leasedAt + LeaseDuration
}

// claimDueSQL leases up to $2 sessions due at $1 to replica $3 until $4, of gateway $5 only ("":
// any; a session of another gateway is its own gateway's replicas' to look after, gwOf). It is
// written for one
// plan that serves every claim (the prepared statement's generic plan, which does not know $2):
// the due sessions are found through the partial index over active sessions (activeStatusSQL) in
// due order, and the leased rows by their primary key (id = ANY of an array). Joined to a CTE
// instead, the generic plan guesses a tenth of the table for LIMIT $2 and hashes all of
// payment_sessions to find them.
var claimDueSQL = `
	UPDATE payment_sessions ps SET lease_owner = $3, lease_until = $4, lease_token = gen_random_uuid()
	WHERE ps.id = ANY(ARRAY(
		SELECT id FROM payment_sessions
		WHERE ` + activeStatusSQL + ` AND next_check_at <= $1 AND flagged_at IS NULL
		  AND (lease_until IS NULL OR lease_until <= $1) AND ($5::text = '' OR gateway = $5)
		ORDER BY next_check_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED))
	RETURNING ` + sessionColumns + `, ps.lease_token::text`

// claimDue leases up to limit due sessions to this replica, each with a fresh token. A lease that
// expired (its drive died or is late) is as good as free; a live one is skipped, and so are rows
// another replica is claiming right now (SKIP LOCKED).
func (s *Service) claimDue(ctx context.Context, limit int) ([]leasedSession, error) {
	now := s.cfg.Clock.Now()
	var out []leasedSession
	err := s.inTx(ctx, "sweep: claim", func(tx pgx.Tx) error {
		// One statement, sent with BEGIN and COMMIT in one round trip (commitWith).
		var b pgx.Batch
		// PostgreSQL would plan the claim afresh every time (0.4 ms, more than it takes to run):
		// a custom plan knows LIMIT's value and looks cheaper than the generic plan, which
		// guesses a tenth of the table — though both walk payment_sessions_due in order and
		// stop at the limit. The generic plan is the one to keep (TestPatrolClaimKeepsItsGenericPlan).
		b.Queue(`SET LOCAL plan_cache_mode = force_generic_plan`)
		b.Queue(claimDueSQL, now, limit, s.cfg.ReplicaID, now.Add(s.cfg.LeaseDuration), s.gatewayName()).Query(func(rows pgx.Rows) error {
			var err error
			out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (leasedSession, error) {
				l := leasedSession{leasedAt: now}
				var err error
				l.sess, err = scanSession(withTrailing{r, []any{&l.token}})
				return l, err
			})
			return err
		})
		if err := commitWith(ctx, tx, &b); err != nil {
			return fmt.Errorf("sweep: claim: %w", err)
		}
		return nil
	})
	return out, err
}

// withTrailing scans a row whose first columns are what a scan function knows and whose last
// columns are extra (a lease token after sessionColumns).
type withTrailing struct {
	pgx.Row
	extra []any
}

func (w withTrailing) Scan(dest ...any) error { return w.Row.Scan(append(dest, w.extra...)...) }

// driveLeased drives one claimed session under its lease. It reports what is left of the lease:
// to be given back with the next step of the schedule (by the producer's releaseBatch); lost,
// when the drive found it taken over, in which case it does nothing further — the new holder owns
// the session and its schedule; or nothing, when the session's terminal transition gave it back.
func (s *Service) driveLeased(ctx context.Context, sess Session, token string) driveEnd {
	ctx, span := s.startSpan(ctx, "sweep.drive", sess.ID, sess.OrderID)
	defer span.End()
	ctx = withLease(ctx, sess.ID, token)
	err := s.drive(ctx, sess)
	if errors.Is(err, ErrLeaseLost) {
		s.log.Warn("sweep: lease lost during the drive; leaving the session to its new holder", "session", sess.ID)
		span.SetAttributes(attrLeaseLost.Bool(true))
		return endLost
	}
	if err != nil {
		s.log.Info("sweep: session not settled this round", "session", sess.ID, "status", sess.Status, "err", err)
		traceError(ctx, err)
	}
	// A session that reached a terminal state gave its lease back in the settle's own UPDATE
	// (sessionPatch.endLease): there is nothing left to release.
	if leaseWasEnded(ctx) {
		return endDone
	}
	return endRelease
}

// drive moves one leased session as far as the gateway's word allows. Before anything that acts
// at the gateway (register, reverse) it checks that the lease still holds; every apply is guarded
// by the lease token (lockOrderAndSession).
func (s *Service) drive(ctx context.Context, sess Session) error {
	actor := Actor{Kind: ActorSweeper, ID: s.cfg.ReplicaID}
	var err error
	switch sess.Status {
	case StatusCanceling:
		var pending bool
		if err = s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM reverse_operations WHERE session_id = $1 AND status = 'Pending')`, sess.ID).Scan(&pending); err != nil {
			return fmt.Errorf("sweep: reverse operation: %w", err)
		}
		if !pending {
			_, err = s.check(ctx, actor, sess)
			return err
		}
		if sess.GatewayPaymentID != "" {
			// The reverse goes at once. Without the gateway's id, driveReverse looks the payment
			// up first and holds right before what it sends: held here, a look-up that failed
			// left a hold for a send that never went, and finance's Retry waited for it (a
			// review of send_held_at).
			if err = s.holdForSend(ctx, sess); err != nil {
				return err
			}
		}
		_, err = s.driveReverse(ctx, actor, sess)
		return err
	case StatusRegistering, StatusUnknown:
		if sess.GatewayPaymentID != "" {
			_, err = s.check(ctx, actor, sess)
			return err
		}
		// Recover a registration whose answer never came: look it up by our reference first
		// (a gateway that cannot be trusted with keys must not get a second request), and only
		// when the gateway has nothing, register again with the same key.
		gp, found, err := s.gatewayState(ctx, sess)
		if err != nil {
			return err
		}
		if found {
			_, err = s.applyGatewayPayment(ctx, actor, sess, gp, "found by reference")
			return err
		}
		if err := s.holdForSend(ctx, sess); err != nil {
			return err
		}
		if sess.Status == StatusRegistering {
			_, err = s.register(ctx, actor, sess)
			return err
		}
		// register() applies failures from Registering only; an Unknown session is
		// re-registered through the same key and its success applied the same way.
		gp, err = s.registerAgain(ctx, sess) // holds the session when its answer never came
		if err != nil && FailureOf(err) == FailureDefinitive {
			_, err = s.registrationFailed(ctx, actor, sess, err, time.Time{}) // a refusal: nothing in flight
			return err
		}
		if err != nil {
			return err
		}
		_, err = s.applyGatewayPayment(ctx, actor, sess, gp, "registered again with the same key")
		return err
	default:
		_, err = s.check(ctx, actor, sess)
		return err
	}
}

// HousekeepingEvery is how often (by the service clock) a replica's patrol also reaps expired
// idempotency keys and old checkout intents, and redacts dead codes in the outbox. Every
// replica may do it: the deletes are batched and skip rows another replica holds.
const HousekeepingEvery = 5 * time.Minute

// housekeep deletes what has expired, in bounded batches. Dead codes are redacted first: that
// step keeps a promise (no code in clear in the outbox past HousekeepingEvery), the others keep
// tables small. It returns the redaction's error (runUpkeep decides when to try again).
func (s *Service) housekeep(ctx context.Context) (redactErr error) {
	if _, err := s.RedactDeadCodes(ctx, s.cfg.Clock.Now(), 1000); err != nil {
		redactErr = err
		s.logPatrolError("redact dead codes", err)
	}
	// The short steps before the reapers, whose backlog (a day of keys after an outage) may take
	// the pass's whole bound: a pass cut there is not run again before HousekeepingEvery (runUpkeep),
	// and a proposal of a disabled user left behind holds its payment (a review).
	if n, err := s.WithdrawProposalsOfDisabled(ctx); err != nil {
		s.logPatrolError("withdraw proposals of disabled users", err)
	} else if n > 0 {
		s.log.Info("withdrew proposals of disabled users", "count", n)
	}
	// The exact counts' delta tables fold when read (StatusCounts, trialBalanceByDay); read them
	// here too, so they stay small with no dashboard open and nothing scraping /metrics, and a
	// first read never sums months of rows (an outside review).
	if _, err := s.StatusCounts(ctx); err != nil {
		s.logPatrolError("fold status counts", err)
	}
	if _, err := s.trialBalanceByDay(ctx, LedgerFilter{}); err != nil {
		s.logPatrolError("fold ledger day totals", err)
	}
	if _, err := s.db.Exec(ctx, `DELETE FROM sweeper_heartbeats WHERE beat_at < $1`, s.cfg.Clock.Now().Add(-HeartbeatRetention)); err != nil {
		s.logPatrolError("reap heartbeats", err)
	}
	if _, err := s.reapOpsSamples(ctx); err != nil {
		s.logPatrolError("reap ops samples", err)
	}
	if n, err := s.ReapIdempotencyKeys(ctx, s.cfg.Clock.Now(), 1000); err != nil {
		s.logPatrolError("reap idempotency keys", err)
	} else if n > 0 {
		s.log.Info("reaped idempotency keys", "count", n)
	}
	if _, err := s.ReapCheckoutIntents(ctx); err != nil {
		s.logPatrolError("reap checkout intents", err)
	}
	return redactErr
}

// RunSweeper runs the patrol every interval until ctx ends: a round over due sessions, pending
// refunds and undelivered customer messages through one pool (PatrolRound) with its heartbeat,
// every HousekeepingEvery the reapers, and every ReconcileEvery a reconciliation run
// (reconcile.go) if this replica leads it. When ctx ends, the drives in flight are cut at their
// next gateway call and give their leases back on the way out; the patrol then gives up its
// reconciliation leadership and its heartbeat row.
func (s *Service) RunSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	side := min(interval, s.cfg.SideLoopEvery) // the side loops' look, whatever SWEEP_INTERVAL is
	if s.cfg.EventsWebhook.URL != "" {
		// The events webhook (feed_push.go) on its own loop: a slow shop holds its POSTs, never
		// the patrol's rounds (TestSlowShopDoesNotHoldThePatrol).
		pushed := make(chan struct{})
		go func() { defer close(pushed); s.runEventsWebhook(ctx, side) }()
		defer func() { <-pushed }()
	}
	// Reconciliation on its own loop too: a batch is a search and a read by id per session, one
	// after another, and inline it held the leader's patrol for as long (an outside review saw
	// the leader's due sessions wait 90 s behind 55 searches of a slow gateway).
	reconciled := make(chan struct{})
	go func() { defer close(reconciled); s.runReconcile(ctx, side) }()
	// Housekeeping and the Operations samples on a loop of their own as well: a round lasts as
	// long as work is due (a drain after an outage is one round), and inline they waited for its
	// end — dead codes stayed in clear in the outbox past their promised 5 minutes and the backlog
	// chart had no sample for exactly the minutes of the backlog (an outside review).
	upkept := make(chan struct{})
	go func() { defer close(upkept); s.runUpkeep(ctx, side) }()
	defer func() { <-upkept }()
	for {
		if _, err := s.patrolRound(ctx, interval); err != nil && ctx.Err() == nil {
			s.logPatrolError("patrol", err)
		}
		select {
		case <-ctx.Done():
			<-reconciled // its last round ended: nothing renews the leadership given up below
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			s.releaseLeadershipOnShutdown(rctx)
			s.forgetHeartbeat(rctx)
			cancel()
			return
		case <-t.C:
		}
	}
}

// runUpkeep is RunSweeper's upkeep loop, looked at every interval: the reapers every
// HousekeepingEvery, and the Operations page's sample of each minute (ops_samples.go: tried once
// per minute per replica; the first replica in the minute writes it, the others find it written).
//
// Each lasts a lease at most (upkeepBound), as the patrol's own statements do: under the loop's
// context alone, a statement the database never answered (a failover that left the old host
// silent) held the loop — no dead code redacted, no minute sampled — until TCP gave up.
// Housekeeping cut by its bound before its redaction ran runs again at the next pass, not
// HousekeepingEvery later; cut after it, HousekeepingEvery later (the promise was kept).
func (s *Service) runUpkeep(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastHousekeeping, lastSample time.Time
	lockWaited := false // the last housekeeping's redaction met a lock wait or statement timeout
	for {
		if now := s.cfg.Clock.Now(); now.Sub(lastHousekeeping) >= HousekeepingEvery {
			hctx, cancel := context.WithTimeout(ctx, s.upkeepBound())
			// When the redaction failed (its promise: no code in clear past HousekeepingEvery),
			// again at the next pass after an outage (the database may be back) or a first lock
			// wait or statement timeout (the lock may be free); in a minute after any other
			// failure, or a lock wait that lasts: at every pass, one would rerun every step and
			// log every 10 s for as long as it lasted (reviews), and a minute keeps the promise
			// to within a minute.
			switch err := s.housekeep(hctx); {
			case err == nil:
				// The redaction ran (it goes first): a later step cut by the bound or an outage
				// goes on at the next housekeeping; rerun at every pass, a reaper's backlog
				// redid the redaction and every step each pass (session 53's note).
				lastHousekeeping, lockWaited = now, false
			case hctx.Err() != nil || DatabaseUnavailable(err):
				// again at the next pass
			case lockTimedOut(err) && !lockWaited:
				lockWaited = true
			default:
				lastHousekeeping = now.Add(time.Minute - HousekeepingEvery)
			}
			cancel()
		}
		if now := s.cfg.Clock.Now(); now.Truncate(OpsSampleEvery).After(lastSample) {
			sctx, cancel := context.WithTimeout(ctx, s.upkeepBound())
			if _, err := s.SampleOps(sctx); err == nil {
				lastSample = now.Truncate(OpsSampleEvery)
			} else if ctx.Err() == nil {
				s.logPatrolError("ops sample", err) // tried again next pass
			}
			cancel()
		}
		if h := s.cfg.Hooks.AfterUpkeep; h != nil {
			h(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// upkeepBound is how long one housekeeping pass or one sample may take: a lease, and never less
// than upkeepAtLeast (GATEWAY_TIMEOUT may be as short as 10 ms, its lease 60 ms: a housekeeping
// cut every time would never redact a dead code).
func (s *Service) upkeepBound() time.Duration { return max(s.cfg.LeaseDuration, upkeepAtLeast) }

const upkeepAtLeast = 5 * time.Second

// runReconcile is RunSweeper's reconciliation loop: every ReconcileEvery a round (only the
// leader compares; the others try for the leader row), looked at every interval.
func (s *Service) runReconcile(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last time.Time
	for {
		if now := s.cfg.Clock.Now(); now.Sub(last) >= ReconcileEvery {
			s.reconcileRound(ctx)
			last = now
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
