package payments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reconciliation (design.md, "Beyond the seeds"): one replica at a time walks the sessions that
// changed recently, asks the gateway what it holds under each session's reference, and compares.
//
//   - A succeeded/authorized gateway payment for a Failed or Canceled session (a late payment
//     whose webhook was lost) → a late_payment case. No money moves.
//   - Several gateway payments under one reference → a duplicate_gateway_payment case about the
//     ones other than the session's own that hold or may take money (duplicateFacts; money held
//     for a Failed or Canceled session is its late_payment case's).
//   - A Completed session whose gateway payment is not succeeded, or is for another amount or
//     currency → a gateway_mismatch case.
//   - An active session the gateway has moved on (settled, authorized, found) → applied through
//     applyGatewayPayment, the path Check and the sweeper use, under the order → session locks.
//     Reconciliation never writes money state itself.
//   - A Completed session's refunds settled Succeeded within RefundReadBack (30 days) are read
//     back: a refund the gateway now calls failed, knows for another amount, or does not know →
//     a gateway_mismatch case for finance (readBackRefunds, reconcile_refunds.go). The refund and
//     the ledger stay as they are.
//
// One runner: a TTL row in maintenance_leaders, taken and renewed by one atomic upsert with the
// service clock's time. Leadership only keeps replicas from doing the same work twice; it is not
// what keeps money right — every effect above is idempotent (guarded transitions, one open case
// per session and kind), so a leader deposed in the middle of a session (it stalled past its TTL)
// can at worst ask the gateway about that one session again. The leader renews its row after each
// session in the same transaction that moves the cursor, so a deposed leader cannot move the
// cursor and stops at once.
//
// The walk is a keyset scan in (updated_at, id) order over one pass window
// (pass start - Lookback, pass start], Batch sessions per run, with the position persisted in
// reconcile_cursors: a long history is spread over runs, and a new leader carries on where the
// old one stopped. Sessions changed during a pass move past the window's end and are seen again in
// the next pass, so every session changed within the lookback is compared at least once a pass.
//
// The reference gateway has no list-all endpoint (gateway-api.md), so reconciliation starts from
// our sessions and asks by reference; a gateway payment whose reference is no session of ours is
// not found this way (webhooks record those as unknown_payment).
//
// On demand (`pitlane reconcile --since 24h`, ReconcileSince), one run compares every session
// changed within the window, from its own in-memory position (the patrol's cursor is not moved),
// under the same lease. Because the patrol's leader keeps the row between its runs, the row also
// says whether a run is under way (running_until, set with every take or renewal and cleared when
// a run ends): an on-demand run takes the row over from a leader that is between runs, never from
// one that is running, and gives it back when it ends, so the patrol's next try takes it again.

// ReconcileConfig tunes reconciliation. Zero fields take DefaultReconcileConfig's values.
type ReconcileConfig struct {
	// Lookback: sessions updated within it (from the pass start) are compared.
	Lookback time.Duration
	// Batch: sessions compared per run (one gateway find each, sometimes a status call too).
	Batch int
	// LeaderTTL: how long leadership lasts without renewal. A replica that dies holding it is
	// replaced after this long; it must exceed the time one session takes (a gateway timeout or
	// two) plus what skew between replicas' clocks is left (servers read the database's clock).
	// Zero: DefaultReconcileConfig's, or three gateway timeouts when that is longer.
	LeaderTTL time.Duration
	// MaxFailures: runs in a row that may fail on the same session (gateway down, lock timeout)
	// before it is skipped until the next pass.
	MaxFailures int
	// RefundReadBack: a Completed session's refunds settled Succeeded within it (from now) are
	// read back from the gateway when the session is compared (readBackRefunds); older ones are
	// not asked about again.
	RefundReadBack time.Duration
}

// DefaultReconcileConfig is what ReconcileOnce and the patrol use.
var DefaultReconcileConfig = ReconcileConfig{
	Lookback:       7 * 24 * time.Hour,
	Batch:          100,
	LeaderTTL:      5 * time.Minute,
	MaxFailures:    3,
	RefundReadBack: 30 * 24 * time.Hour,
}

// ReconcileEvery is how often (by the service clock) each replica's patrol tries to reconcile:
// the leader runs one batch, the others find the leader row taken and do nothing else.
const ReconcileEvery = time.Minute

// reconcileConfig fills cfg's zero fields: DefaultReconcileConfig's, and a LeaderTTL of at least
// three gateway timeouts (a session takes a find and a status call): a run ends with its
// leadership (boundByLeadership), and one cut on the same slow session every run would never
// get past it.
func (s *Service) reconcileConfig(c ReconcileConfig) ReconcileConfig {
	if c.LeaderTTL <= 0 {
		c.LeaderTTL = max(DefaultReconcileConfig.LeaderTTL, 3*s.cfg.GatewayTimeout)
	}
	return c.withDefaults()
}

// ReconcileLeaderTTL is the TTL of this service's reconciliation lease when the config leaves
// it zero (reconcileConfig).
func (s *Service) ReconcileLeaderTTL() time.Duration {
	return s.reconcileConfig(ReconcileConfig{}).LeaderTTL
}

func (c ReconcileConfig) withDefaults() ReconcileConfig {
	d := DefaultReconcileConfig
	if c.Lookback <= 0 {
		c.Lookback = d.Lookback
	}
	if c.Batch <= 0 {
		c.Batch = d.Batch
	}
	if c.LeaderTTL <= 0 {
		c.LeaderTTL = d.LeaderTTL
	}
	if c.MaxFailures <= 0 {
		c.MaxFailures = d.MaxFailures
	}
	if c.RefundReadBack <= 0 {
		c.RefundReadBack = d.RefundReadBack
	}
	return c
}

// ReconcileReport says what one run did.
type ReconcileReport struct {
	// Leader: this replica holds the job and ran. false: another replica (LeaderID) holds it
	// and nothing was compared.
	Leader   bool
	LeaderID string
	// Checked: sessions compared with the gateway.
	Checked int
	// Findings (a finding already open as a case is counted again; the case is not).
	LatePayments int // late_payment: money at the gateway for a Failed/Canceled session
	Duplicates   int // duplicate_gateway_payment: several gateway payments for one session
	Mismatches   int // gateway_mismatch: a Completed session the gateway does not call succeeded, a payment it lost, or one for another amount or currency, or a Succeeded refund it contradicts
	Driven       int // active sessions moved through the normal apply path
	// RefundsReadBack: Succeeded refunds of the compared sessions the gateway answered about
	// (readBackRefunds); RefundContradictions: those whose answer contradicts the books (failed,
	// another amount, no such refund), each also a gateway_mismatch finding unless finance
	// resolved the same news before.
	RefundsReadBack      int
	RefundContradictions int
	// Errors: sessions this run could not finish (gateway or database); the run stops at the
	// first and the next run retries it, up to MaxFailures runs, then Skipped counts it.
	Errors  int
	Skipped int
	// PassDone: the run reached the end of the pass; the next run starts a new one.
	PassDone bool
	// LostLeadership: another replica took the job over during the run (this one had stalled
	// past its TTL); the run stopped without moving the cursor.
	LostLeadership bool
	// Findings: what the run found, one entry per difference, driven session or failure, in
	// the order the sessions were compared (bounded by the run's sessions).
	Findings []ReconcileFinding
	// Since, CasesOpened: ReconcileSince only. Since is the start of the window compared;
	// CasesOpened are the finance cases opened on the compared sessions while the run ran,
	// by reconciliation itself or by the apply path it drove (a case already open is not
	// opened again, and so not listed).
	Since       time.Time
	CasesOpened []FinanceCase
}

// Kinds of ReconcileFinding besides the finance case kinds (CaseLatePayment,
// CaseDuplicatePayment, CaseGatewayMismatch).
const (
	FindingDriven = "driven" // an active session the gateway had moved on, applied through Check's path
	FindingError  = "error"  // the session could not be compared (gateway or database); Detail says why
)

// ReconcileFinding is one thing a reconciliation run found about one session.
type ReconcileFinding struct {
	SessionID string
	OrderID   string
	Kind      string // a finance case kind, FindingDriven or FindingError
	Detail    string
}

// found records a finding and counts it under its kind.
func (r *ReconcileReport) found(sess Session, kind, detail string) {
	switch kind {
	case CaseLatePayment:
		r.LatePayments++
	case CaseDuplicatePayment:
		r.Duplicates++
	case CaseGatewayMismatch:
		r.Mismatches++
	case FindingDriven:
		r.Driven++
	case FindingError:
		r.Errors++
	}
	r.Findings = append(r.Findings, ReconcileFinding{SessionID: sess.ID, OrderID: sess.OrderID, Kind: kind, Detail: detail})
}

// reconcileJob names the job in maintenance_leaders and reconcile_cursors: one per gateway, as
// sessions are compared with the gateway that holds them.
func (s *Service) reconcileJob() string { return "reconcile:" + s.gw.Name() }

// ReconcileOnce runs one reconciliation batch with DefaultReconcileConfig if this replica is (or
// becomes) the leader; see ReconcileOnceWith.
func (s *Service) ReconcileOnce(ctx context.Context) (ReconcileReport, error) {
	return s.ReconcileOnceWith(ctx, ReconcileConfig{})
}

// ReconcileOnceWith takes or renews the reconciliation leadership and, as leader, compares one
// batch of sessions (from the persisted cursor) with the gateway. Another replica's live
// leadership is not an error: the report says Leader=false.
func (s *Service) ReconcileOnceWith(ctx context.Context, cfg ReconcileConfig) (ReconcileReport, error) {
	cfg = s.reconcileConfig(cfg)
	ctx, lead, end := boundByLeadership(ctx, cfg.LeaderTTL)
	defer end()
	job, rep, err := s.startRun(ctx, lead, false)
	if err != nil || !rep.Leader {
		return rep, err
	}
	defer s.endRun(ctx, job)
	cur, err := s.readCursor(ctx, job)
	if err != nil {
		return rep, err
	}
	if cur.passStartedAt == nil {
		now := s.cfg.Clock.Now()
		cur.passStartedAt = &now
	}
	batch, err := s.reconcileBatch(ctx, cur, cfg)
	if err != nil {
		return rep, err
	}
	for _, sess := range batch {
		if ctx.Err() != nil {
			return rep, context.Cause(ctx)
		}
		next := cur
		// A panic (an answer the code does not expect) is the session's failure, retried and
		// then skipped like any: it ended the replica, and the next leader resumed from the same
		// cursor into the same panic — every replica in turn.
		serr := s.compareSession(ctx, sess, &rep, cfg)
		if serr != nil && ctx.Err() != nil {
			return rep, context.Cause(ctx) // shutting down, or past the leadership: not the session's fault, nothing to count
		}
		if serr != nil {
			rep.found(sess, FindingError, serr.Error())
			if next.failingID != sess.ID {
				// The count is of one session: the one that failed before left the window.
				next.failures, next.failingID = 0, sess.ID
			}
			next.failures++
			if next.failures < cfg.MaxFailures {
				s.log.Warn("reconcile: session not compared; will retry", "session", sess.ID, "failures", next.failures, "err", serr)
				if ok, err := s.advance(ctx, job, cfg, next); err != nil || !ok {
					rep.LostLeadership = !ok && err == nil
					return rep, err
				}
				return rep, nil
			}
			s.log.Error("reconcile: session skipped until the next pass", "session", sess.ID, "failures", next.failures, "err", serr)
			rep.Skipped++
		}
		next.afterUpdatedAt, next.afterID, next.failures, next.failingID = &sess.UpdatedAt, sess.ID, 0, ""
		from := time.Now()
		ok, err := s.advance(ctx, job, cfg, next)
		if err != nil {
			return rep, err
		}
		if !ok {
			rep.LostLeadership = true
			return rep, nil
		}
		lead.renewed(from)
		cur = next
		if serr != nil {
			return rep, nil // skipped after repeated failures: the gateway is probably down; stop here
		}
	}
	if len(batch) < cfg.Batch {
		// Nothing left in this pass's window: the next run starts a new pass.
		done := reconcileCursor{passes: cur.passes + 1, prevPassStartedAt: cur.passStartedAt}
		ok, err := s.advance(ctx, job, cfg, done)
		if err != nil {
			return rep, err
		}
		rep.PassDone, rep.LostLeadership = ok, !ok
	}
	return rep, nil
}

// ReconcileSince is the on-demand run (`pitlane reconcile --since D`): it compares every session
// of this gateway updated within since (up to now), under the patrol's one-runner lease, and
// reports what it found and which finance cases were opened.
//
// The lease: taken if it is free or expired, or if its holder is between runs (a patrol's leader
// keeps the row between its runs); refused (Leader false, LeaderID the holder, nothing compared)
// while another replica is running. It is renewed after every session, like the patrol's, and
// given back at the end, so the patrol's next try takes it again at once. The patrol's cursor is
// not moved: this run walks its own window, Batch sessions per read, and the patrol's pass goes
// on where it was.
//
// A session that cannot be compared (gateway down, lock timeout) is reported as a FindingError
// and the run moves on; after cfg.MaxFailures failures in a row it stops (the gateway is
// probably down), with PassDone false. Everything a run does is idempotent, so running it again
// is always safe.
func (s *Service) ReconcileSince(ctx context.Context, since time.Duration, cfg ReconcileConfig) (ReconcileReport, error) {
	cfg = s.reconcileConfig(cfg)
	if since <= 0 {
		return ReconcileReport{}, Invalid("since", "the window must be positive, got %s", since)
	}
	ctx, lead, end := boundByLeadership(ctx, cfg.LeaderTTL)
	defer end()
	job, rep, err := s.startRun(ctx, lead, true)
	if err != nil || !rep.Leader {
		return rep, err
	}
	defer func() {
		if _, err := s.execDetached(ctx, `DELETE FROM maintenance_leaders WHERE job = $1 AND owner = $2`,
			job, s.cfg.ReplicaID); err != nil {
			s.log.Warn("reconcile: give the lease back", "job", job, "err", err)
		}
	}()

	// Cases are listed by id above the highest one before the run: ids only grow, so every case
	// opened from here on has a higher one.
	var highWater int64
	if err := s.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM finance_cases`).Scan(&highWater); err != nil {
		return rep, fmt.Errorf("reconcile: cases before the run: %w", err)
	}
	now := s.cfg.Clock.Now()
	rep.Since = now.Add(-since)
	cfg.Lookback = since
	var compared []string
	rep, err = s.reconcileWindow(ctx, job, lead, cfg, reconcileCursor{passStartedAt: &now}, rep, &compared)
	// A session of the window that moved while the run was busy with earlier ones (a Check, a
	// webhook) now has an updated_at past the window's top and was never reached: the run said
	// "compared to the end" without it (an outside review). Catch-up walks over what changed
	// since the walk before, until one finds nothing; each covers only the time the one before
	// took, so a few do. A session's updated_at is its writer's clock read before its locks:
	// it commits up to writeLag later, behind a walk already past it, so each catch-up starts
	// that much earlier (a Check that waited on the order's lock while the run walked was never
	// compared: an outside review); what a walk compared is not compared again.
	lag := s.writeLag()
	for from, round := now, 0; err == nil && rep.PassDone && !rep.LostLeadership && round < maxReconcileCatchUps; round++ {
		to := s.cfg.Clock.Now()
		before := len(compared)
		start := from.Add(-lag)
		after := reconcileCursor{passStartedAt: &to, prevPassStartedAt: &rep.Since, afterUpdatedAt: &start, afterID: maxUUID}
		if rep, err = s.reconcileWindow(ctx, job, lead, cfg, after, rep, &compared); len(compared) == before {
			break
		}
		from = to
	}
	// Listed however the run ended (cut by Ctrl-C or a timeout, a database error): the command
	// prints the report of a cut run too, and its cases were opened all the same.
	lctx, cancel := Outlive(ctx, RecordGrace)
	defer cancel()
	opened, cerr := s.casesOpened(lctx, highWater, compared)
	rep.CasesOpened = opened
	return rep, errors.Join(err, cerr)
}

// maxReconcileCatchUps bounds ReconcileSince's walks over sessions that moved during the run.
const maxReconcileCatchUps = 3

// maxUUID is the highest uuid: a cursor after (t, maxUUID) starts after every session of t.
const maxUUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"

// reconcileWindow is ReconcileSince's walk over its window from cur (its top: passStartedAt);
// compared collects every session it looked at, the one it was cut on included, and a session
// in it already is not compared again.
func (s *Service) reconcileWindow(ctx context.Context, job string, lead *leadership, cfg ReconcileConfig, cur reconcileCursor, rep ReconcileReport, compared *[]string) (ReconcileReport, error) {
	rep.PassDone = false
	seen := make(map[string]bool, len(*compared))
	for _, id := range *compared {
		seen[id] = true
	}
	inARow := 0
walk:
	for {
		batch, err := s.reconcileBatch(ctx, cur, cfg)
		if err != nil {
			return rep, err
		}
		for _, sess := range batch {
			if seen[sess.ID] {
				// Compared already; moved since (by this run's own settle, most often).
				cur.afterUpdatedAt, cur.afterID = &sess.UpdatedAt, sess.ID
				continue
			}
			// A panic (an answer the code does not expect) is the session's failure, retried and
			// then skipped like any: it ended the replica, and the next leader resumed from the same
			// cursor into the same panic — every replica in turn.
			serr := s.compareSession(ctx, sess, &rep, cfg)
			*compared = append(*compared, sess.ID)
			if serr != nil && ctx.Err() != nil {
				return rep, context.Cause(ctx) // interrupted, or past the leadership: not the session's fault
			}
			if serr != nil {
				rep.found(sess, FindingError, serr.Error())
				if inARow++; inARow >= cfg.MaxFailures {
					break walk
				}
			} else {
				inARow = 0
			}
			cur.afterUpdatedAt, cur.afterID = &sess.UpdatedAt, sess.ID
			from := time.Now()
			owner, err := s.elect(ctx, s.db, job, cfg.LeaderTTL, true)
			if err != nil {
				return rep, err
			}
			if owner != s.cfg.ReplicaID {
				rep.LostLeadership = true
				break walk
			}
			lead.renewed(from)
		}
		if len(batch) < cfg.Batch {
			rep.PassDone = true
			break
		}
	}
	return rep, nil
}

// casesOpened lists the finance cases with an id above highWater on the given sessions.
func (s *Service) casesOpened(ctx context.Context, highWater int64, sessionIDs []string) ([]FinanceCase, error) {
	if len(sessionIDs) == 0 {
		return nil, nil
	}
	rows, err := s.db.Query(ctx, `SELECT id, session_id::text, coalesce(order_id, ''), kind, detail, created_at
		FROM finance_cases WHERE id > $1 AND session_id = ANY($2::uuid[]) ORDER BY id`, highWater, sessionIDs)
	if err != nil {
		return nil, fmt.Errorf("reconcile: cases opened: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FinanceCase, error) {
		var c FinanceCase
		err := r.Scan(&c.ID, &c.SessionID, &c.OrderID, &c.Kind, &c.Detail, &c.CreatedAt)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: cases opened: %w", err)
	}
	return out, nil
}

// compareSession compares one session under a bound of its own, two thirds of the leader TTL
// (renewed just before it), so that a session whose comparison does not end (a gateway search
// whose pages never end, a call that hangs past its timeout) fails as the session's own failure —
// counted, retried, then skipped — with a third of the lease left to record that. Under the
// run's context alone it ended with the lease, which counted nothing, and every run after
// started on the same session: reconciliation of the whole gateway stopped there (an outside
// review, reconcile3). A panic (an answer the code does not expect) is the session's failure
// too.
func (s *Service) compareSession(ctx context.Context, sess Session, rep *ReconcileReport, cfg ReconcileConfig) error {
	sctx, cancel := context.WithTimeout(ctx, cfg.LeaderTTL*2/3)
	defer cancel()
	return s.panicAsError("reconcile: session "+sess.ID, func() error { return s.reconcileSession(sctx, sess, rep, cfg.RefundReadBack) })
}

// errLeadershipLapsed is the cause of a reconciliation run's context that outlived its leadership.
var errLeadershipLapsed = errors.New("the run outlived its lease: no renewal within its TTL (is the database answering?)")

// leadership bounds a reconciliation run by the leadership it runs under: the run's context
// (boundByLeadership) ends the leader TTL after the last take or renewal was sent, when the
// leader row expires and another replica may run. Under the patrol's own context alone, a run
// whose statement the database never answered (a failover that left the old host silent) held
// the replica's reconciliation loop until TCP gave up, long after another replica had taken over.
type leadership struct {
	ttl   time.Duration
	timer *time.Timer
}

// boundByLeadership returns ctx ending (cause errLeadershipLapsed) ttl from now unless renewed.
func boundByLeadership(ctx context.Context, ttl time.Duration) (context.Context, *leadership, context.CancelFunc) {
	lctx, cancel := context.WithCancelCause(ctx)
	l := &leadership{ttl: ttl, timer: time.AfterFunc(ttl, func() { cancel(errLeadershipLapsed) })}
	return lctx, l, func() { l.timer.Stop(); cancel(nil) }
}

// renewed moves the bound to the leader TTL after from, when the take or renewal that succeeded
// was sent.
func (l *leadership) renewed(from time.Time) { l.timer.Reset(l.ttl - time.Since(from)) }

// startRun takes (or renews) the reconciliation lease for a run, onDemand as elect's
// preemptIdle, and moves lead's bound with it. The report says whether this replica leads now
// and, if not, who does.
func (s *Service) startRun(ctx context.Context, lead *leadership, onDemand bool) (string, ReconcileReport, error) {
	var rep ReconcileReport
	if s.gw == nil {
		return "", rep, errors.New("reconcile: no gateway configured")
	}
	if s.cfg.ReplicaID == "" {
		return "", rep, errors.New("reconcile: the service has no ReplicaID to lead with")
	}
	job := s.reconcileJob()
	from := time.Now()
	owner, err := s.elect(ctx, s.db, job, lead.ttl, onDemand)
	if err != nil {
		return job, rep, err
	}
	rep.LeaderID, rep.Leader = owner, owner == s.cfg.ReplicaID
	if rep.Leader {
		lead.renewed(from)
	}
	return job, rep, nil
}

// elect takes the job for this replica if it is free or expired, or renews it if this replica
// holds it, in one statement, and returns the owner after it; either way the row is marked as
// running (running_until, the same TTL): elect is called only to run, or to go on running. The
// time comes from the service clock. A row held by another replica is left as it is, unless
// preemptIdle (an on-demand run) and that replica is between runs.
func (s *Service) elect(ctx context.Context, q querier, job string, ttl time.Duration, preemptIdle bool) (string, error) {
	now := s.cfg.Clock.Now()
	var owner string
	err := q.QueryRow(ctx, `
		INSERT INTO maintenance_leaders AS l (job, owner, elected_at, until, running_until) VALUES ($1, $2, $3, $4, $4)
		ON CONFLICT (job) DO UPDATE SET
			owner = excluded.owner,
			elected_at = CASE WHEN l.owner = excluded.owner THEN l.elected_at ELSE excluded.elected_at END,
			until = excluded.until,
			running_until = excluded.running_until
		WHERE l.owner = excluded.owner OR l.until <= excluded.elected_at
			OR ($5 AND coalesce(l.running_until, '-infinity') <= excluded.elected_at)
		RETURNING owner`, job, s.cfg.ReplicaID, now, now.Add(ttl), preemptIdle).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		// Someone else leads. Who, for the report (the row may vanish meanwhile: then nobody).
		err = q.QueryRow(ctx, `SELECT owner FROM maintenance_leaders WHERE job = $1`, job).Scan(&owner)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", nil
		}
	}
	if err != nil {
		return "", fmt.Errorf("reconcile: elect: %w", err)
	}
	return owner, nil
}

// endRun marks this replica's run of job over (running_until cleared), keeping the row: the
// patrol's leader stays leader between its runs, but an on-demand run may now take the row.
// If it fails, running_until expires with the lease.
func (s *Service) endRun(ctx context.Context, job string) {
	if _, err := s.execDetached(ctx, `UPDATE maintenance_leaders SET running_until = NULL WHERE job = $1 AND owner = $2`,
		job, s.cfg.ReplicaID); err != nil {
		s.log.Warn("reconcile: mark the run over", "job", job, "err", err)
	}
}

// ReleaseLeadership gives up every maintenance job this replica leads (graceful shutdown), so
// another replica takes over at its next try instead of after the TTL. Cursors stay.
func (s *Service) ReleaseLeadership(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM maintenance_leaders WHERE owner = $1`, s.cfg.ReplicaID); err != nil {
		return fmt.Errorf("release leadership: %w", err)
	}
	return nil
}

// reconcileCursor is a row of reconcile_cursors. passStartedAt nil: no pass under way.
type reconcileCursor struct {
	passStartedAt *time.Time
	// prevPassStartedAt: where the pass before started (migration 00550): the window reaches
	// down to it when the pass outlived the lookback.
	prevPassStartedAt *time.Time
	afterUpdatedAt    *time.Time
	afterID           string
	failures          int
	// failingID: the session failures counts (migration 00900); another one starts from nothing.
	failingID string
	passes    int64
}

func (s *Service) readCursor(ctx context.Context, job string) (reconcileCursor, error) {
	var c reconcileCursor
	var afterID, failingID *string
	err := s.db.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO reconcile_cursors (job, updated_at, updated_by) VALUES ($1, $2, $3)
			ON CONFLICT (job) DO NOTHING
			RETURNING pass_started_at, after_updated_at, after_id::text, failures, passes, prev_pass_started_at, failing_id::text
		)
		SELECT * FROM ins
		UNION ALL
		SELECT pass_started_at, after_updated_at, after_id::text, failures, passes, prev_pass_started_at, failing_id::text
		FROM reconcile_cursors WHERE job = $1
		LIMIT 1`, job, s.cfg.Clock.Now(), s.cfg.ReplicaID).
		Scan(&c.passStartedAt, &c.afterUpdatedAt, &afterID, &c.failures, &c.passes, &c.prevPassStartedAt, &failingID)
	if err != nil {
		return c, fmt.Errorf("reconcile: read cursor: %w", err)
	}
	if afterID != nil {
		c.afterID = *afterID
	}
	if failingID != nil {
		c.failingID = *failingID
	}
	return c, nil
}

// advance renews this replica's leadership and, only if that succeeded, stores the cursor, in one
// transaction: the leader row stays locked until the cursor is written, so a replica trying to
// take over either waits and finds the lease renewed, or took it before and this returns false.
func (s *Service) advance(ctx context.Context, job string, cfg ReconcileConfig, c reconcileCursor) (bool, error) {
	ctx, cancel := Outlive(ctx, RecordGrace) // the session was compared: record it
	defer cancel()
	mine := false
	err := s.inTx(ctx, "reconcile: advance", func(tx pgx.Tx) error {
		owner, err := s.elect(ctx, tx, job, cfg.LeaderTTL, false)
		if err != nil {
			return err
		}
		if mine = owner == s.cfg.ReplicaID; !mine {
			return nil
		}
		var afterID, failingID any
		if c.afterID != "" {
			afterID = c.afterID
		}
		if c.failingID != "" && c.failures > 0 {
			failingID = c.failingID
		}
		_, err = tx.Exec(ctx, `UPDATE reconcile_cursors SET pass_started_at = $2, after_updated_at = $3, after_id = $4,
			failures = $5, passes = $6, updated_at = $7, updated_by = $8, prev_pass_started_at = $9, failing_id = $10 WHERE job = $1`,
			job, c.passStartedAt, c.afterUpdatedAt, afterID, c.failures, c.passes, s.cfg.Clock.Now(), s.cfg.ReplicaID, c.prevPassStartedAt, failingID)
		if err != nil {
			return fmt.Errorf("reconcile: advance: %w", err)
		}
		return nil
	})
	return mine && err == nil, err
}

// reconcileBatch reads the next sessions of the pass after the cursor. Registering sessions
// younger than RegisterGrace are left to the Create that is registering them.
func (s *Service) reconcileBatch(ctx context.Context, c reconcileCursor, cfg ReconcileConfig) ([]Session, error) {
	start := *c.passStartedAt
	bottom := start.Add(-cfg.Lookback)
	if c.prevPassStartedAt != nil && c.prevPassStartedAt.Before(bottom) {
		bottom = *c.prevPassStartedAt // the previous pass outlived the lookback: no gap between them
	}
	var afterID any
	if c.afterID != "" {
		afterID = c.afterID
	}
	rows, err := s.db.Query(ctx, `SELECT `+sessionColumns+` FROM payment_sessions
		WHERE gateway = $1 AND updated_at > $2 AND updated_at <= $3
		  AND (updated_at, id) > (coalesce($4::timestamptz, '-infinity'), coalesce($5::uuid, '00000000-0000-0000-0000-000000000000'))
		  AND NOT (status = 'Registering' AND created_at > $6)
		ORDER BY updated_at, payment_sessions.id
		LIMIT $7`,
		s.gw.Name(), bottom, start, c.afterUpdatedAt, afterID,
		s.cfg.Clock.Now().Add(-s.cfg.RegisterGrace), cfg.Batch)
	if err != nil {
		return nil, fmt.Errorf("reconcile: batch: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) { return scanSession(r) })
	if err != nil {
		return nil, fmt.Errorf("reconcile: batch: %w", err)
	}
	return out, nil
}

// reconcileAnsweredAboutAnother: asked for payment asked by its id, the gateway answered about
// another (gp). Nothing of it is compared: taken as the session's own, another session's
// captured payment was late money for a Failed session (its order's checkout held, a refund
// invited) or a "duplicate" of a Completed one, with no mismatch raised (a review of answers
// about other things; Check opens a gateway_mismatch case for the same answer). Finance gets that
// case; the pass goes on with what the search by reference found (late or duplicate money
// carrying the session's reference is still found: a review of the first fix, which returned
// here), without an own payment to compare. Its fact is foreign (foreignFact): as the session's,
// a session without its gateway id settled Failed later kept it as held money, a late_payment
// case for another customer's payment (a review).
func (s *Service) reconcileAnsweredAboutAnother(ctx context.Context, sess Session, rep *ReconcileReport, asked string, gp GatewayPayment) error {
	return s.reconcileCase(ctx, sess, rep, CaseGatewayMismatch, fmt.Sprintf(
		"reconciliation: asked for payment %s, the gateway answered about payment %s; nothing compared", asked, orNone(gp.ID)), foreignFact(gp))
}

// reconcileSession compares one session with what the gateway holds under its reference and acts
// on the difference (see the top of this file), and reads back a Completed session's refunds
// settled Succeeded within readBack (readBackRefunds). An error means the session was not
// compared to the end; everything it did is idempotent, so doing it again is safe.
func (s *Service) reconcileSession(ctx context.Context, sess Session, rep *ReconcileReport, readBack time.Duration) error {
	ctx, span := s.startSpan(ctx, "payments.reconcile", sess.ID, sess.OrderID)
	defer span.End()
	actor := Actor{Kind: ActorSystem, ID: "reconcile:" + s.cfg.ReplicaID}
	started := time.Now()
	found, err := s.gwOf(sess).FindByReference(ctx, sess.Reference())
	s.logGatewayCall(ctx, sess.ID, "find", "", started, err)
	if err != nil {
		return err
	}
	found = distinctPayments(found)
	// Our own payment: the one the session is attached to, always asked for by id (GET by id is
	// the gateway's word; a search index may lag, and Stripe's does by up to an hour: its stale
	// copy of a payment just Completed opened a false gateway_mismatch case, an outside review).
	// Its answer replaces the search's copy, for Failed and Canceled sessions too.
	var own GatewayPayment
	haveOwn := false
	mine := sess.Status.Active() || sess.Status == StatusCompleted
	switch {
	case sess.GatewayPaymentID != "":
		started := time.Now()
		gp, err := s.gwOf(sess).Status(ctx, sess.GatewayPaymentID)
		s.logGatewayCall(ctx, sess.ID, "status", "", started, err)
		notFound := gatewayNotFound(err)
		switch {
		case notFound && mine:
			// The gateway lost the payment we attached: flagged (active) and a case, as Check does.
			if _, ferr := s.flagMissingAtGateway(ctx, sess, err); ferr != nil {
				return ferr
			}
			rep.found(sess, CaseGatewayMismatch, fmt.Sprintf("reconciliation: the gateway has no payment %s", sess.GatewayPaymentID))
			rep.Checked++
			return nil
		case notFound:
		case err != nil:
			return err
		case gp.ID != sess.GatewayPaymentID:
			if err := s.reconcileAnsweredAboutAnother(ctx, sess, rep, sess.GatewayPaymentID, gp); err != nil {
				return err
			}
		default:
			found = withAnswer(found, gp)
			own, haveOwn = gp, mine
		}
	case mine && len(found) > 0:
		// No id attached yet (the registration's answer was lost): what Check would pick, asked
		// for by its id too (the search's copy of a payment Completed by people lagged: a false
		// gateway_mismatch case, an outside review).
		started := time.Now()
		asked := pickPayment(found).ID
		gp, err := s.gwOf(sess).Status(ctx, asked)
		s.logGatewayCall(ctx, sess.ID, "status", "", started, err)
		if err != nil {
			return err
		}
		if gp.ID != asked {
			if err := s.reconcileAnsweredAboutAnother(ctx, sess, rep, asked, gp); err != nil {
				return err
			}
			break
		}
		found = withAnswer(found, gp)
		own, haveOwn = gp, true
	}

	ownID := sess.GatewayPaymentID
	switch {
	case ownID == "" && haveOwn:
		ownID = own.ID
	case ownID == "" && len(found) > 0:
		ownID = pickPayment(found).ID
	}
	if facts := duplicateFacts(found, ownID, sess.Status); len(found) > 1 && len(facts) > 0 {
		if err := s.reconcileCase(ctx, sess, rep, CaseDuplicatePayment, fmt.Sprintf(
			"reconciliation: %d gateway payments carry reference %s: %s", len(found), sess.Reference(), describePayments(found)),
			facts...); err != nil {
			return err
		}
	}
	switch {
	case sess.Status == StatusFailed || sess.Status == StatusCanceled:
		var paid []GatewayPayment
		for _, gp := range found {
			if gp.Status == GatewaySucceeded || gp.Status == GatewayAuthorized {
				paid = append(paid, gp)
			}
		}
		if len(paid) > 0 {
			facts := make([]string, len(paid))
			for i, gp := range paid {
				facts[i] = gatewayFact(gp)
			}
			if err := s.reconcileCase(ctx, sess, rep, CaseLatePayment, fmt.Sprintf(
				"reconciliation: the gateway holds money for a %s session (its webhook never arrived): %s", sess.Status, describePayments(paid)),
				facts...); err != nil {
				return err
			}
		}
	case sess.Status == StatusCompleted:
		detail, fact := "", ""
		switch {
		case haveOwn && own.Status != GatewaySucceeded:
			detail = fmt.Sprintf("reconciliation: the gateway says %s for the Completed session's payment %s", own.Status, own.ID)
			fact = gatewayFact(own)
		case haveOwn && answerMismatch(sess, own) != "":
			detail, fact = "reconciliation: "+answerMismatch(sess, own), gatewayFact(own)
		case sess.GatewayPaymentID == "" && len(found) == 0:
			// Completed by people (four-eyes) before the gateway's id was known, and the gateway
			// has nothing under our reference: the contradiction Check reports too.
			detail = "reconciliation: the gateway has no payment with reference " + sess.Reference() + " for a Completed session"
			fact = missingFact(sess.Reference())
		}
		if detail != "" {
			if err := s.reconcileCase(ctx, sess, rep, CaseGatewayMismatch, detail, fact); err != nil {
				return err
			}
		}
		if err := s.readBackRefunds(ctx, sess, rep, readBack); err != nil {
			return err
		}
	case sess.Status.Active():
		// Whatever the normal path would make of this answer, it makes of it now: a guarded
		// transition under the order → session locks, the ledger entry with Completed, a case
		// where the answer contradicts us, a flag and a case where its amount or currency is not
		// the session's. decide and answerMismatch are only the filter for "anything to do".
		if haveOwn && (decide(sess.Status, own.Status, false) != (outcome{}) || answerMismatch(sess, own) != "") {
			from := s.cfg.Clock.Now()
			after, err := s.applyGatewayPayment(ctx, actor, sess, own, "reconciliation: the gateway says "+string(own.Status))
			if err != nil {
				return err
			}
			if after.Status != sess.Status {
				moved, err := s.movedBy(ctx, sess, actor, from)
				if err != nil {
					return err
				}
				if moved {
					rep.found(sess, FindingDriven, fmt.Sprintf("%s → %s: the gateway says %s for %s", sess.Status, after.Status, own.Status, own.ID))
				}
			}
			if mismatch := answerMismatch(sess, own); mismatch != "" {
				rep.found(sess, CaseGatewayMismatch, "reconciliation: "+mismatch)
			}
		}
	}
	rep.Checked++
	return nil
}

// movedBy reports whether actor moved sess on (wrote a transition of it) at or after from:
// a session the run found active may have been settled meanwhile by its webhook, a Check or the
// patrol (the apply then finds it settled and writes nothing), and the report called that
// reconciliation's doing ("driven", an outside review). One probe of session_events_session.
func (s *Service) movedBy(ctx context.Context, sess Session, actor Actor, from time.Time) (bool, error) {
	var moved bool
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM session_events WHERE session_id = $1
		AND actor_kind = $2 AND actor_id = $3 AND created_at >= $4)`, sess.ID, actor.Kind, actor.ID, from).Scan(&moved)
	if err != nil {
		return false, fmt.Errorf("reconcile: who moved the session: %w", err)
	}
	return moved, nil
}

// reconcileCase opens a finance case (at most one open per session and kind) for what the
// gateway said, and records the finding. Only the finance row is written, so no order or
// session lock is needed.
//
// A contradiction finance has resolved already is not opened again: every pass finds a late
// payment refunded by hand at the gateway (its payment still reads succeeded) or a duplicate
// finance chose to keep, and a case reopened each pass (every minute in a small shop) refilled
// finance's queue with work done and invited a second refund (an outside review). The detail
// names the contradiction (the session's state, the gateway's payments with their status and
// amounts), so one that changes — another payment, another status, another amount — is a new
// detail and opens a new case.
func (s *Service) reconcileCase(ctx context.Context, sess Session, rep *ReconcileReport, kind, detail string, facts ...string) error {
	ctx, cancel := Outlive(ctx, RecordGrace) // the gateway has spoken: record it
	defer cancel()
	settled := false
	if err := s.inTx(ctx, "reconcile: case", func(tx pgx.Tx) error {
		// By its facts, whoever found it first (a Check, a webhook: another wording), or, for a
		// case resolved before cases kept facts, by its detail.
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM finance_cases
			WHERE session_id = $1 AND kind = $2 AND detail = $3 AND resolved_at IS NOT NULL)`, sess.ID, kind, detail).Scan(&settled); err != nil || settled {
			return err
		}
		var err error
		if settled, err = factsResolved(ctx, tx, sess.ID, kind, facts); err != nil || settled {
			return err
		}
		if kind == CaseLatePayment {
			return noteLatePayment(ctx, tx, sess, detail, s.cfg.Clock.Now(), facts)
		}
		// noteCase: a payment found while a case of the kind is open (a second late payment, a
		// duplicate captured since) is added to it; openCase dropped it (an outside review).
		return noteCase(ctx, tx, sess.ID, sess.OrderID, kind, detail, s.cfg.Clock.Now(), facts...)
	}); err != nil {
		return err
	}
	if !settled {
		rep.found(sess, kind, detail)
	}
	return nil
}

// describePayments names payments in a case's detail, in the order of their ids: the detail is
// how reconcileCase knows a contradiction finance resolved, whatever order the gateway lists in.
func describePayments(ps []GatewayPayment) string {
	parts := paymentFacts(ps)
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// reconcileRound is the patrol's call: one run, logged.
func (s *Service) reconcileRound(ctx context.Context) {
	if s.gw == nil || s.cfg.ReplicaID == "" {
		return
	}
	rep, err := s.ReconcileOnceWith(ctx, ReconcileConfig{Batch: s.cfg.ReconcileBatch})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("reconcile", "err", err)
		}
		return
	}
	if rep.Leader && (rep.Checked > 0 || rep.Errors > 0 || rep.LostLeadership) {
		s.log.Info("reconcile", "checked", rep.Checked, "late_payments", rep.LatePayments, "duplicates", rep.Duplicates,
			"mismatches", rep.Mismatches, "driven", rep.Driven, "refunds_read_back", rep.RefundsReadBack,
			"refund_contradictions", rep.RefundContradictions, "errors", rep.Errors, "skipped", rep.Skipped,
			"pass_done", rep.PassDone, "lost_leadership", rep.LostLeadership)
	}
}

// releaseLeadershipOnShutdown is one of the patrol's last acts (its drives give their leases back as they end).
func (s *Service) releaseLeadershipOnShutdown(ctx context.Context) {
	if err := s.ReleaseLeadership(ctx); err != nil {
		s.log.Error("reconcile: release leadership on shutdown", "err", err)
	}
}
