package payments

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// The patrol's engine: how one replica drives due work (sessions, refunds, outbox messages)
// against the gateway, many at once, under leases that hold.
//
//   - A bounded worker pool per replica (SweepConcurrency). The producer claims in short
//     transactions (FOR UPDATE SKIP LOCKED: replicas never wait for or double-take each other's
//     rows) exactly as many rows as it has free workers (River's producer: fetch limit = free
//     workers), starts one drive per row, and claims again as soon as drives finish — never batch
//     by batch. No transaction is open and no lock is held while a drive talks to the gateway.
//   - A lease per row: (lease_owner, lease_until, lease_token) with a fresh uuid token per claim.
//     The drive carries its token in its context; every apply transaction locks its row only
//     while the row still carries that token (lockOrderAndSession, the refund and outbox
//     updates), and the release — of all drives finished since the producer last woke, in one
//     statement (releaseBatch) — is a guarded UPDATE … WHERE lease_token = token. A drive that
//     finds its lease lost does nothing further. The lease is LeaseFor(GATEWAY_TIMEOUT) long and
//     the drive's context ends a gateway timeout before it, so an honest drive always fits.
//   - Back-pressure: every gateway call a drive makes is counted into its round
//     (logGatewayCall). When most calls of a round fail (5xx, timeouts, refused connections),
//     the producer stops claiming and the whole patrol backs off (doubling, capped), then probes
//     with a few drives before it runs at full width again: no thundering herd after an outage.
//   - A heartbeat row per replica (sweeper_heartbeats), written every round.

// DefaultSweepConcurrency is SWEEP_CONCURRENCY's default.
const DefaultSweepConcurrency = 16

// LeaseFor is the lease of one claim for a gateway timeout: six timeouts. The longest drive makes
// three gateway calls one after another (look up by reference, reverse, read the state after a
// refusal), each bounded by the timeout, plus short transactions; the drive's context ends one
// timeout before the lease, so the lease is never the thing that runs out first.
func LeaseFor(gatewayTimeout time.Duration) time.Duration {
	if gatewayTimeout <= 0 {
		gatewayTimeout = defaultGatewayTimeout
	}
	return 6 * gatewayTimeout
}

// Back-pressure settings: a round in which at least BackoffMinCalls gateway calls were made and
// at least BackoffFailShare of its last ones (backoffWindow) failed stops claiming and makes the
// patrol back off, PatrolBackoffBase at first, doubling with each failed probe up to
// PatrolBackoffMax.
const (
	BackoffMinCalls   = 10
	BackoffFailShare  = 0.5
	PatrolBackoffBase = 5 * time.Second
	PatrolBackoffMax  = 2 * time.Minute
)

// ErrLeaseLost: the row no longer carries the drive's lease token (the lease ran out and another
// claim took the row). The drive stops; the new holder owns the row and its schedule.
var ErrLeaseLost = errors.New("patrol: lease lost to a later claim; this drive stops")

type leaseCtxKey struct{}

type driveLease struct {
	id, token string
	// ended is set when the drive's settle ended the lease itself (a session that reached a
	// terminal state under its lease: endLease), so the producer has nothing to give back.
	ended *atomic.Bool
}

// withLease marks ctx as a drive holding the lease token of row id.
func withLease(ctx context.Context, id, token string) context.Context {
	return context.WithValue(ctx, leaseCtxKey{}, driveLease{id: id, token: token, ended: new(atomic.Bool)})
}

// leaseEnded notes that the settle of ctx's drive ended its lease, if sess (its row as that
// settle committed it) no longer carries one. (withLease always gives the lease its flag.)
func leaseEnded(ctx context.Context, sess Session) {
	if l, ok := ctx.Value(leaseCtxKey{}).(driveLease); ok && l.id == sess.ID && sess.LeaseUntil == nil {
		l.ended.Store(true)
	}
}

// leaseWasEnded reports whether ctx's drive's lease was ended by its settle.
func leaseWasEnded(ctx context.Context) bool {
	l, ok := ctx.Value(leaseCtxKey{}).(driveLease)
	return ok && l.ended.Load()
}

// leaseOf returns the token ctx holds for row id, if any.
func leaseOf(ctx context.Context, id string) (string, bool) {
	l, ok := ctx.Value(leaseCtxKey{}).(driveLease)
	if !ok || l.id != id {
		return "", false
	}
	return l.token, true
}

// holdForSend is called before anything that acts at the gateway is sent for sess (a
// registration, a reverse), and reports ErrLeaseLost when ctx is a drive of it whose token the
// row no longer carries: a drive that lost its lease must not act twice with the new holder.
// What is sent may still be processed by the gateway RegisterGrace after the send, whatever
// becomes of this process, and nobody may send it again meanwhile: a drive's lease is held that
// long past the send (it ran out a gateway timeout after a send late in the drive, and the next
// replica, finding nothing by reference yet, registered beside it: two payments at a gateway that
// ignores keys, a review), and an unleased sender's session (a cancel's drive) is due no sooner
// (holdForRegistration); a Create whose claim came late holds its session by holdLateSend.
// The hold runs from the time read once its row is locked: a wait for the lock (another
// transaction on the order, up to lock_timeout) before the send would otherwise come off it (a
// review).
func (s *Service) holdForSend(ctx context.Context, sess Session) error {
	fromNow := func() time.Time { return s.cfg.Clock.Now().Add(s.cfg.RegisterGrace) }
	token, ok := leaseOf(ctx, sess.ID)
	if !ok {
		return s.holdForRegistration(ctx, sess, fromNow)
	}
	return s.holdLeaseForSend(ctx, sessionLeases, sess.ID, token, `true`)
}

// holdLeaseForSend holds a drive's lease on row id of tbl RegisterGrace past a send about to go
// out, from the time read once the row is locked (holdForSend's rule; a refund's send keeps it
// too), and reports ErrLeaseLost when the row no longer carries token or no longer matches still
// (SQL over row t: a refund settled meanwhile is never sent again). The row keeps that a send
// was let go (send_held_at, migration 01020): a late first send (holdLateSend) never goes beside
// it, whatever becomes of the lease and of the call's log row.
func (s *Service) holdLeaseForSend(ctx context.Context, tbl leaseTable, id, token, still string) error {
	return s.inTx(ctx, "patrol: lease for a send", func(tx pgx.Tx) error {
		var held bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+tbl.name+` t WHERE t.id = $1 AND t.lease_token = $2 AND `+still+` FOR UPDATE)`,
			id, token).Scan(&held); err != nil {
			return fmt.Errorf("patrol: lease check: %w", err)
		}
		if !held {
			return ErrLeaseLost
		}
		now := s.cfg.Clock.Now()
		_, err := tx.Exec(ctx, `UPDATE `+tbl.name+` SET lease_until = greatest(lease_until, $2), send_held_at = $3 WHERE id = $1`,
			id, now.Add(s.cfg.RegisterGrace), now)
		return err
	})
}

// leaseTable is a table whose rows the patrol leases, schedules and flags (sessions, refunds).
type leaseTable struct {
	name      string // the table
	settled   string // SQL over row t: it needs no next look (a final state)
	sessionID string // SQL over row t: the session a finance case names
	caseKind  string // the case opened when the schedule runs out
	reason    string // SQL over row t as it was before the release: why it is flagged
	// sends: SQL over row t: its drive may send what moves money (a registration, a reverse,
	// a refund) rather than only read; cut by the stop, that call may still be on the wire.
	sends string
}

var (
	sessionLeases = leaseTable{name: "payment_sessions", settled: `t.status IN ('Completed', 'Failed', 'Canceled')`,
		sessionID: `t.id`, caseKind: CaseSweepExhausted,
		reason: `format('no final answer from the gateway after %s looks; still %s', t.check_attempts + 1, t.status)`,
		sends:  `(t.gateway_payment_id IS NULL AND t.status IN ('Registering', 'Unknown')) OR t.status = 'Canceling'`}
	refundLeases = leaseTable{name: "refunds", settled: `t.status <> 'Pending'`,
		sessionID: `t.session_id`, caseKind: CaseRefundUnsettled,
		reason: `format('refund %s: no final answer from the gateway after %s looks; still Pending', t.id, t.check_attempts + 1)`,
		sends:  `true`}
)

// heldLease is a lease a finished drive gives back.
type heldLease struct{ id, token string }

// releaseBatch is the one release of leased rows: in one short transaction, one guarded UPDATE
// gives back every lease whose row still carries its token (… WHERE lease_token = token; a row
// another claim took over is left to its new holder) and records the look with the next one on
// the schedule (Backoff) — or, when the schedule ran out, flags the row and opens the table's
// finance case. A settled row gets no next look. The next look is never sooner than one set
// while the drive ran: a cancel confirmed under the drive set its first look after the grace
// in which its own reverse goes out, and a release that brought it forward would have another
// replica send the same reverse beside it (TestReleaseKeepsAConfirmedCancelsGrace). The producer releases the drives that finished
// together, as River's completer does, instead of one transaction per drive. It returns how many
// leases were no longer held.
//
// how: releaseLooked, the drives' looks happened (their schedule moves on); releaseUntouched,
// the drives sent nothing (a lease spent before its drive began): the rows are given back due
// now, schedule and attempts untouched; releaseCut, the drives were cut by this replica's
// shutdown at their gateway call, so their look did not happen — but the call may be on the
// wire, still processed by the gateway after we hung up: the rows are due once it can no longer
// be in flight (RegisterGrace, as for a Registering session whose process died; due now, the
// next replica looked up by reference, found nothing yet and registered again beside it — two
// payments at a gateway that ignores keys: an outside review, stop), schedule and attempts
// untouched, instead of after the lease would have run out (six gateway timeouts) or after the
// next step of a schedule the cut look never earned.
func (s *Service) releaseBatch(ctx context.Context, tbl leaseTable, leases []heldLease, how releaseHow) (lost int, err error) {
	if len(leases) == 0 {
		return 0, nil
	}
	// The drives are done: their looks must be recorded, though the round stops; but within a
	// lease (later, every lease given back has run out anyway), not for as long as a silent
	// database keeps the statement waiting.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LeaseDuration)
	defer cancel()
	now := s.cfg.Clock.Now()
	ids, tokens := make([]string, len(leases)), make([]string, len(leases))
	for i, l := range leases {
		ids[i], tokens[i] = l.id, l.token
	}
	steps := make([]float64, len(s.cfg.Backoff))
	for i, d := range s.cfg.Backoff {
		steps[i] = d.Seconds()
	}
	switch how {
	case releaseUntouched:
		return s.releaseInterrupted(ctx, tbl, ids, tokens, now, now)
	case releaseCut:
		return s.releaseInterrupted(ctx, tbl, ids, tokens, now, now.Add(s.cfg.RegisterGrace))
	}
	err = s.inTx(ctx, tbl.name+": release", func(tx pgx.Tx) error {
		// In SET, t.* is the row before the update; in RETURNING, after it. Arrays are 1-based:
		// after n looks (n = old check_attempts + 1) the next step is Backoff[n], element n + 1.
		rows, err := tx.Query(ctx, `UPDATE `+tbl.name+` t SET lease_owner = NULL, lease_until = NULL, lease_token = NULL,
				check_attempts = t.check_attempts + 1,
				next_check_at = CASE WHEN `+tbl.settled+` OR t.flagged_at IS NOT NULL OR t.check_attempts + 1 >= $3 THEN NULL
					ELSE greatest($4::timestamptz + make_interval(secs => ($5::float8[])[t.check_attempts + 2]), t.next_check_at) END,
				flagged_at = CASE WHEN NOT (`+tbl.settled+`) AND t.check_attempts + 1 >= $3 THEN coalesce(t.flagged_at, $4) ELSE t.flagged_at END,
				flag_reason = CASE WHEN NOT (`+tbl.settled+`) AND t.check_attempts + 1 >= $3 THEN coalesce(t.flag_reason, `+tbl.reason+`) ELSE t.flag_reason END
			FROM unnest($1::text[]::uuid[], $2::text[]::uuid[]) AS r(id, token)
			WHERE t.id = r.id AND t.lease_token = r.token
			RETURNING t.id::text, `+tbl.sessionID+`::text, t.order_id, NOT (`+tbl.settled+`) AND t.check_attempts >= $3, coalesce(t.flag_reason, '')`,
			ids, tokens, len(s.cfg.Backoff), now, steps)
		if err != nil {
			return fmt.Errorf("%s: release: %w", tbl.name, err)
		}
		type exhausted struct{ id, sessionID, orderID, reason string }
		var flagged []exhausted
		n := 0
		for rows.Next() {
			var e exhausted
			var out bool
			if err := rows.Scan(&e.id, &e.sessionID, &e.orderID, &out, &e.reason); err != nil {
				rows.Close()
				return fmt.Errorf("%s: release: %w", tbl.name, err)
			}
			n++
			if out {
				flagged = append(flagged, e)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("%s: release: %w", tbl.name, err)
		}
		lost = len(leases) - n
		for _, e := range flagged {
			// noteCase: a second refund of the payment running out while the first one's case is
			// open is added to it (openCase dropped it, and finance resolved a case naming the
			// first alone, an outside review); a session's case gets a repeat of its own reason
			// once.
			if err := noteCase(ctx, tx, e.sessionID, e.orderID, tbl.caseKind, e.reason, now); err != nil {
				return err
			}
		}
		return nil
	})
	return lost, err
}

// releaseHow is how a batch of leases is given back (releaseBatch).
type releaseHow int

const (
	releaseLooked    releaseHow = iota // the drives looked: the schedule moves on
	releaseUntouched                   // nothing sent: due now
	releaseCut                         // cut by the stop at their gateway call: due once it cannot be in flight
)

// releaseInterrupted gives back the leases of drives that did not look (releaseBatch): guarded
// by token like every release; a row the cut drive settled after all needs no next look, one
// whose drive may have been sending (tbl.sends) is due at sent, every other one at now (or when
// a look set while the drive ran says, as in releaseBatch).
func (s *Service) releaseInterrupted(ctx context.Context, tbl leaseTable, ids, tokens []string, now, sent time.Time) (lost int, err error) {
	tag, err := s.execBounded(ctx, tbl.name+": release on shutdown", `UPDATE `+tbl.name+` t SET lease_owner = NULL, lease_until = NULL, lease_token = NULL,
			next_check_at = CASE WHEN `+tbl.settled+` OR t.flagged_at IS NOT NULL THEN t.next_check_at
				ELSE greatest(CASE WHEN `+tbl.sends+` THEN $4::timestamptz ELSE $3::timestamptz END, t.next_check_at) END
		FROM unnest($1::text[]::uuid[], $2::text[]::uuid[]) AS r(id, token)
		WHERE t.id = r.id AND t.lease_token = r.token`, ids, tokens, now, sent)
	if err != nil {
		return 0, fmt.Errorf("%s: release on shutdown: %w", tbl.name, err)
	}
	return len(ids) - int(tag.RowsAffected()), nil
}

// roundStats counts what the drives of one round did at the gateway: in all (the round's report)
// and over its last backoffWindow calls, which is what the back-off judges. A round lasts as long
// as work is due (a drain after an outage is one round): judged over the whole round, a gateway
// that failed again half-way was hidden by the calls it had answered before, and the patrol went
// on at full width until the failures outnumbered them — thousands of timeouts after a long
// drain (an outside review).
type roundStats struct {
	calls  atomic.Int64
	failed atomic.Int64 // no trustworthy answer: 5xx, timeout, connection refused

	mu     sync.Mutex
	recent [backoffWindow]bool // true: failed; a ring over the last calls
	n      int                 // calls in recent (at most backoffWindow)
	next   int
	bad    int // failed calls in recent
}

// backoffWindow is how many of a round's last gateway calls the back-off judges.
const backoffWindow = 2 * BackoffMinCalls

type roundCtxKey struct{}

type stopCtxKey struct{}

// withStop marks the end of ctx itself as the stop of the work done under it: the patrol's round
// (SIGTERM ends it) or the request that wrote a message. A context derived from it also ends at
// its own deadline — a drive's budget, a writer's lease — which is no stop: stopped tells the two
// apart.
func withStop(ctx context.Context) context.Context { return context.WithValue(ctx, stopCtxKey{}, ctx) }

// stopped: the work under ctx was cut by its stop (withStop), not by a deadline of its own. Work
// cut by a stop gives its row back with its schedule untouched (the cut try never happened);
// work that ran out of time counts a failed try, or a slow endpoint would be tried for ever.
func stopped(ctx context.Context) bool {
	stop, ok := ctx.Value(stopCtxKey{}).(context.Context)
	return ok && stop.Err() != nil
}

func roundOf(ctx context.Context) *roundStats {
	r, _ := ctx.Value(roundCtxKey{}).(*roundStats)
	return r
}

// count records one gateway call's outcome (nil-safe: calls outside a patrol round count nowhere).
// A definitive refusal is an answer; only calls without one are failures of the gateway.
func (r *roundStats) count(err error) {
	if r == nil {
		return
	}
	r.calls.Add(1)
	failed := err != nil && FailureOf(err) != FailureDefinitive
	if failed {
		r.failed.Add(1)
	}
	r.mu.Lock()
	if r.n == backoffWindow {
		if r.recent[r.next] {
			r.bad--
		}
	} else {
		r.n++
	}
	r.recent[r.next] = failed
	if failed {
		r.bad++
	}
	r.next = (r.next + 1) % backoffWindow
	r.mu.Unlock()
}

// window is the round's last calls (at most backoffWindow) and how many of them failed.
func (r *roundStats) window() (calls, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.bad
}

// failing: at least minCalls calls, and at least BackoffFailShare of the last ones failed.
func (r *roundStats) failing(minCalls int) bool {
	calls, failed := r.window()
	return calls >= minCalls && calls > 0 && float64(failed) >= BackoffFailShare*float64(calls)
}

type slotCtxKey struct{}

// slotPool is a round's width: at most width drives hold a slot, and only a drive holding one
// talks to the gateway. The producer reserves slots before it claims (a drive taking one back in
// between could otherwise make width+1); a drive that handed its slot back and must ask the
// gateway again (an answer overtaken by a newer decision) waits for one.
type slotPool struct {
	mu    sync.Mutex
	busy  int
	width int
	freed chan struct{} // closed (and replaced) when a slot is given back
	wake  chan struct{} // the producer's: a slot was given back
}

func newSlotPool(width int) *slotPool {
	return &slotPool{width: width, freed: make(chan struct{}), wake: make(chan struct{}, 1)}
}

// reserve takes up to n free slots and says how many it took.
func (p *slotPool) reserve(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n = max(0, min(n, p.width-p.busy))
	p.busy += n
	return n
}

// free is how many slots are free now.
func (p *slotPool) free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.width - p.busy
}

// give gives n slots back and wakes whoever waits for one.
func (p *slotPool) give(n int) {
	if n <= 0 {
		return
	}
	p.mu.Lock()
	p.busy -= n
	close(p.freed)
	p.freed = make(chan struct{})
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default: // the producer has a wake-up pending already
	}
}

// acquire waits for a free slot and takes it (ctx: the caller's time).
func (p *slotPool) acquire(ctx context.Context) error {
	for {
		p.mu.Lock()
		if p.busy < p.width {
			p.busy++
			p.mu.Unlock()
			return nil
		}
		freed := p.freed
		p.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// driveSlot is one drive's hold on a slot of its round's pool.
type driveSlot struct {
	pool *slotPool
	mu   sync.Mutex
	held bool
}

func (d *driveSlot) handOff() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held {
		d.held = false
		d.pool.give(1)
	}
}

func (d *driveSlot) retake(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held {
		return nil
	}
	if err := d.pool.acquire(ctx); err != nil {
		return err
	}
	d.held = true
	return nil
}

// handOff gives a patrol drive's slot back to its round: called when the drive has asked the
// gateway everything it expects to ask and only has its answer to write. Outside a drive it
// does nothing.
func handOff(ctx context.Context) {
	if d, ok := ctx.Value(slotCtxKey{}).(*driveSlot); ok {
		d.handOff()
	}
}

// retakeSlot is what a patrol drive that handed its slot back does before it asks the gateway
// again: it waits for a slot of its round (at most SweepConcurrency drives talk to the gateway at
// once; an outside review found the second question asked beside the drive that took the slot).
// An error when ctx ends first. Outside a drive it does nothing.
func retakeSlot(ctx context.Context) error {
	if d, ok := ctx.Value(slotCtxKey{}).(*driveSlot); ok {
		return d.retake(ctx)
	}
	return nil
}

// patrolJob is one leased row.
type patrolJob struct {
	id, token string
	// leasedAt is the claim's time: the lease runs until leasedAt + LeaseDuration, and the
	// round runs the job under driveContext from it.
	leasedAt time.Time
	// run drives the row and says what is left of its lease.
	run func(ctx context.Context) driveEnd
}

// driveEnd is what a drive leaves of its lease.
type driveEnd int

const (
	// endRelease: the producer gives the lease back with the row's next look (releaseBatch).
	endRelease driveEnd = iota
	// endLost: the drive found its lease taken over and did nothing further.
	endLost
	// endDone: the drive gave the lease back itself (an outbox delivery's record, a session's
	// terminal transition: sessionPatch.endLease).
	endDone
)

// patrolSource is one kind of work the patrol drives.
type patrolSource struct {
	kind string
	// claim leases up to limit due rows to this replica in one short transaction.
	claim func(ctx context.Context, limit int) ([]patrolJob, error)
	// leases is the table the producer releases the source's finished drives into (nil: the
	// drives release themselves).
	leases *leaseTable
	// gateway: its drives call the gateway (they count for back-pressure and stop in a back-off).
	gateway bool
}

// runDrive runs one drive. A panic in it (an answer or a row the code does not expect) is
// logged with its stack and counts as a look (endRelease): a session's or refund's row goes back
// with its backoff and, look after look, is flagged for staff like any row that never settles.
// Before, it ended the process, and every replica crash-looped on the same due row (an outside
// review). Sources that keep their own books (an outbox message's attempts, a webhook event's
// retry) turn a panic into a failed try themselves (panicAsError): a lease given back would
// count nothing.
func (s *Service) runDrive(ctx context.Context, kind string, j patrolJob) (end driveEnd) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("patrol: the drive panicked; counted as a look", "kind", kind, "id", j.id,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			end = endRelease
		}
	}()
	return j.run(ctx)
}

// panicAsError runs f and turns a panic in it into its error (logged with its stack), for
// drives whose sources record their own failed tries: the try is then counted, put off and, in
// the end, given up like any failed one. Without it a notifier that panicked on one message was
// called again every lease, attempts 0, never capped (an outside review).
func (s *Service) panicAsError(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error(what+": panicked; recorded as a failed try", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return f()
}

// finishedDrive is what a worker reports to the producer.
type finishedDrive struct {
	source int
	lease  heldLease
	end    driveEnd
	// interrupted: the drive did not look (releaseBatch gives its row back untouched): its
	// lease was spent before it began (nothing sent), or cut: the round's context ended
	// (shutdown) by the time it returned, so it was cut at its gateway call, which may be on the
	// wire still.
	interrupted bool
	cut         bool
}

// patrolState is this replica's patrol: back-off, what it drives now, totals for the heartbeat.
// Its size is bounded (a few numbers and at most SweepConcurrency tokens), never per order.
type patrolState struct {
	mu           sync.Mutex
	startedAt    time.Time
	backoffUntil time.Time
	backoffLevel int // 0: healthy; n: the n-th back-off in a row (the next round probes)
	backoffWhy   string
	lastSweepAt  *time.Time
	last         RoundReport
	drivenTotal  int64
	inFlight     atomic.Int64
	clock        Clock
	outageMu     sync.Mutex
	outage       map[string]*outageLog // per message: the patrol's and its side loops' errors while the database is unavailable
}

// outageLog thins the log of errors that come from the database being unavailable (an outage,
// a failover): every patrol round fails the same way then, five lines a second at a
// SWEEP_INTERVAL of 200 ms. The first is logged at once, then one a minute with how many were
// left out; any other error is logged as it comes. One per message (the patrol, each side
// loop): shared, one loop's line hid another's first of a later outage for a minute (a review).
type outageLog struct {
	last    time.Time // when one was last logged (time.Now: a log's pace, not a rule)
	skipped int
}

// outageLogEvery is how often a run of outage errors is logged.
const outageLogEvery = time.Minute

func (s *Service) logPatrolError(msg string, err error) {
	if !DatabaseUnavailable(err) {
		s.log.Error(msg, "err", err)
		return
	}
	p := s.patrol
	p.outageMu.Lock()
	o := p.outage[msg]
	if o == nil {
		if p.outage == nil {
			p.outage = map[string]*outageLog{}
		}
		o = &outageLog{}
		p.outage[msg] = o
	}
	if !o.last.IsZero() && time.Since(o.last) < outageLogEvery {
		o.skipped++
		p.outageMu.Unlock()
		return
	}
	skipped := o.skipped
	o.last, o.skipped = time.Now(), 0
	p.outageMu.Unlock()
	s.log.Error(msg+" (the database is unavailable; logged once a minute while it lasts)", "err", err, "left_out", skipped)
}

func newPatrolState(clock Clock) *patrolState {
	return &patrolState{startedAt: clock.Now(), clock: clock}
}

// progress records a round's progress as it happens: a claim of due work (swept), and drives
// finished.
func (p *patrolState) progress(swept bool, driven int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if swept {
		now := p.clock.Now()
		p.lastSweepAt = &now
	}
	p.drivenTotal += driven
}

// RoundReport is what one round of the patrol did.
type RoundReport struct {
	Driven int // leases driven (sessions, refunds, messages)
	Lost   int // drives that found their lease taken over and stopped
	Calls  int // gateway calls made by the round's drives
	Failed int // of which had no trustworthy answer
	// Skipped: the patrol was backing off and claimed nothing.
	Skipped bool
	// BackingOff: after this round the patrol backs off until BackoffUntil.
	BackingOff   bool
	BackoffUntil time.Time
}

// PatrolStatus is this replica's patrol as it is now.
type PatrolStatus struct {
	InFlight     int
	BackingOff   bool
	BackoffUntil time.Time
	BackoffLevel int
	Reason       string
	LastRound    RoundReport
}

// backingOff reports whether the patrol backs off from the gateway now.
func (s *Service) backingOff() bool {
	p := s.patrol
	p.mu.Lock()
	defer p.mu.Unlock()
	return s.cfg.Clock.Now().Before(p.backoffUntil)
}

// PatrolStatus reports this replica's patrol state (back-off, drives in flight).
func (s *Service) PatrolStatus() PatrolStatus {
	p := s.patrol
	p.mu.Lock()
	defer p.mu.Unlock()
	now := s.cfg.Clock.Now()
	return PatrolStatus{InFlight: int(p.inFlight.Load()), BackingOff: now.Before(p.backoffUntil),
		BackoffUntil: p.backoffUntil, BackoffLevel: p.backoffLevel, Reason: p.backoffWhy, LastRound: p.last}
}

// runRound drives due rows of the sources with at most SweepConcurrency drives at once, claiming
// as workers free up, until none is due (or the gateway fails for most of the round), and waits
// for its drives to finish. beat, when set, is called between claims at most every beatEvery
// (wall clock) so a long round still shows the replica alive.
//
// While the patrol backs off, sources that call the gateway are skipped. The first round after a
// back-off is a probe: it drives at most a quarter of the pool's width, waits for those drives,
// and goes on at full width only if the gateway answered them.
func (s *Service) runRound(ctx context.Context, sources []patrolSource, beat func(), beatEvery time.Duration) (RoundReport, error) {
	r := s.newProducer(ctx, sources)
	lastBeat := time.Now()
	roundStarted := lastBeat
	var tick <-chan time.Time // nil (never) without a beat
	if beat != nil {
		t := time.NewTicker(beatEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		if ctx.Err() != nil {
			r.stopFetching = true
		}
		r.judgeProbe()
		if beat != nil && time.Since(lastBeat) >= beatEvery {
			beat()
			lastBeat = time.Now()
			r.afterBeat(roundStarted)
		}
		r.claim()
		// Release after the claim: the drives just started need not wait for it, and the rows
		// released here are not due again this round (their next look is in the future).
		r.startRelease()
		if r.inFlight == 0 && r.releasing == nil {
			break // every drive finished and every lease is given back
		}
		r.wait(tick)
	}
	return r.end()
}

// producer is one round of the patrol (runRound), River's producer: it claims due rows for the
// workers that are free, starts a drive for each, and gives the leases of finished drives back.
// Its fields are the round's goroutine's alone; drives report through done, slots and stats.
type producer struct {
	s       *Service
	ctx     context.Context // the round's: its end is the replica's stop
	dctx    context.Context // the drives' parent: ctx marked as the stop, with the round's stats
	sources []patrolSource
	stats   *roundStats
	rep     RoundReport

	// backingOff: the round began in a back-off (gateway sources are skipped). probing: it is
	// the first round after one, driving at most probeSize rows until their answers are in.
	backingOff, probing  bool
	probeSize, probeSent int

	// inFlight: drives started and not finished (their leases are still to be given back). slots:
	// those of them still holding one of the width's slots — a drive gives its slot back when it
	// hands its last answer to be written (handOff), as River frees a worker when its job returns
	// and completes it in the background, and takes one again before it asks the gateway again
	// (retakeSlot). At most width drives talk to the gateway at once, and at most width more wait
	// for their answers to be written.
	width    int
	inFlight int
	slots    *slotPool
	done     chan finishedDrive
	// toRelease: finished drives to release, per source and releaseHow: looked, untouched, cut.
	// releasing: the release in flight reports the leases it found lost; nil: none.
	toRelease [][3][]heldLease
	releasing chan int

	// exhausted: the source came back short since the last beat (everything due is claimed,
	// here or by another replica). next: the source whose turn is next.
	exhausted    []bool
	next         int
	stopFetching bool // claim nothing more this round
	swept        bool // a gateway source was claimed from
	firstErr     error
}

func (s *Service) newProducer(ctx context.Context, sources []patrolSource) *producer {
	p := s.patrol
	now := s.cfg.Clock.Now()
	p.mu.Lock()
	backingOff := now.Before(p.backoffUntil)
	probing := !backingOff && p.backoffLevel > 0
	p.mu.Unlock()

	width := s.cfg.SweepConcurrency
	stats := &roundStats{}
	return &producer{s: s, ctx: ctx, dctx: context.WithValue(withStop(ctx), roundCtxKey{}, stats), sources: sources,
		stats: stats, backingOff: backingOff, probing: probing, probeSize: max(1, width/4),
		width: width, slots: newSlotPool(width), done: make(chan finishedDrive, 2*width),
		toRelease: make([][3][]heldLease, len(sources)), exhausted: make([]bool, len(sources))}
}

// finished records a drive that returned: its lease goes in the next release.
func (r *producer) finished(f finishedDrive) {
	r.rep.Driven++
	r.s.patrol.progress(false, 1) // the heartbeat's total moves with each drive, not at the round's end
	r.inFlight--
	switch f.end {
	case endRelease:
		if r.sources[f.source].leases == nil {
			break // the source's drives give their rows back themselves
		}
		how := releaseLooked
		switch {
		case f.cut:
			how = releaseCut
		case f.interrupted:
			how = releaseUntouched
		}
		r.toRelease[f.source][how] = append(r.toRelease[f.source][how], f.lease)
	case endLost:
		r.rep.Lost++ // the drive found its lease taken over
	}
}

// startRelease gives back the leases of the drives that finished, beside the producer and one
// release at a time (River's completer): the producer goes on claiming for the workers that just
// freed up meanwhile. Whatever finishes during a release goes in the next one.
func (r *producer) startRelease() {
	if r.releasing != nil {
		return
	}
	type job struct {
		tbl    leaseTable
		kind   string
		leases []heldLease
		how    releaseHow
	}
	var jobs []job
	for i := range r.toRelease {
		for k, ls := range r.toRelease[i] {
			if len(ls) == 0 {
				continue
			}
			jobs = append(jobs, job{tbl: *r.sources[i].leases, kind: r.sources[i].kind, leases: ls, how: releaseHow(k)})
			r.toRelease[i][k] = nil
		}
	}
	if len(jobs) == 0 {
		return
	}
	ch := make(chan int, 1)
	r.releasing = ch
	go func() {
		lost := 0
		for _, j := range jobs {
			n, err := r.s.releaseBatch(r.ctx, j.tbl, j.leases, j.how)
			if err != nil {
				r.s.log.Error("patrol: release", "kind", j.kind, "err", err)
			}
			lost += n
		}
		ch <- lost
	}()
}

// claimable: the source is claimed from when its turn comes (not short since the last beat, and
// not a gateway source in a back-off).
func (r *producer) claimable(j int) bool {
	return !r.exhausted[j] && !(r.backingOff && r.sources[j].gateway)
}

// backlog: a source is still claimed from, so the round goes on.
func (r *producer) backlog() bool {
	for j := range r.sources {
		if r.claimable(j) {
			return true
		}
	}
	return false
}

// judgeProbe: once the probe's drives are back, the round goes on at full width, or stops and
// lets judgeRound back off again. A probe that asked the gateway nothing (only a customer message
// was due) proves nothing: the back-off stays as it is and the next round probes again. Judged
// healthy, it ended the back-off with the gateway still down, and the next round hit it at full
// width (an outside review).
func (r *producer) judgeProbe() {
	if !r.probing || r.probeSent == 0 || r.inFlight != 0 {
		return
	}
	if calls, _ := r.stats.window(); calls == 0 {
		r.stopFetching = true
	} else if r.stats.failing(1) {
		r.stopFetching = true
	} else {
		r.probing = false
		r.s.endBackoff()
	}
}

// afterBeat decides, at each beat, whether the round claims on.
func (r *producer) afterBeat(roundStarted time.Time) {
	switch {
	case r.backingOff && !r.s.backingOff():
		// The back-off this round began in is over: the round claims nothing more, so it ends
		// with its drives and the next one probes the gateway (a round of outbox drives alone,
		// re-armed every beat, kept every gateway source skipped).
		r.stopFetching = true
	case time.Since(roundStarted) < r.s.driveBudget() || r.backlog():
		// What fell due since a source came back short (first looks, rows a stopping replica
		// handed back due now) is claimed now, as the next round would: a round lasts as long as
		// its slowest drive (up to the drive budget, five gateway timeouts), and its free workers
		// waited for that with due work in the table. Past one drive budget of the round's start
		// only while another source still has due work: a round fed every beat alone would never
		// end, and its report (judgeRound) never come; a round fed by a backlog goes on anyway (a
		// drain after an outage is one round), and a source short once waited behind all of it (a
		// due session behind a thousand pending refunds: an outside review).
		clear(r.exhausted)
	}
}

// claim leases due rows for the free workers, the sources in turn, and starts their drives.
func (r *producer) claim() {
	s, p := r.s, r.s.patrol
	free := min(r.slots.free(), 2*r.width-r.inFlight)
	if r.probing {
		free = min(free, r.probeSize-r.probeSent)
	}
	for !r.stopFetching && free > 0 {
		if !r.probing && r.stats.failing(BackoffMinCalls) {
			r.stopFetching = true // the gateway is failing: claim nothing more this round
			return
		}
		i := -1
		for k := range r.sources {
			j := (r.next + k) % len(r.sources)
			if r.claimable(j) {
				i = j
				break
			}
		}
		if i < 0 {
			return
		}
		r.next = (i + 1) % len(r.sources)
		src := r.sources[i]
		if r.ctx.Err() != nil {
			r.stopFetching = true // stopped between two claims
			return
		}
		// A claim is not cut by the stop: cut while its COMMIT's answer is on the wire, it would
		// have leased rows it never returns, and they would wait out their lease with no drive
		// (six gateway timeouts). A claim begun before the stop ends (SKIP LOCKED: it waits for
		// no row), and its drives, started under the stopped round, give their rows straight
		// back, due now. One still running a gateway timeout after the stop (behind a
		// migration's table lock, a database that stopped answering) is cut then: a stop never
		// hangs on it.
		reserved := r.slots.reserve(free) // a drive retaking a slot meanwhile gets none of these
		if reserved == 0 {
			return
		}
		cctx, cancelClaim := s.claimContext(r.ctx)
		jobs, err := src.claim(cctx, reserved)
		cancelClaim()
		r.slots.give(reserved - len(jobs))
		if err != nil {
			r.firstErr = err
			r.stopFetching = true
			return
		}
		if src.gateway {
			// A long drain is one round: its claims are sweeping, and the heartbeat says so as
			// they happen (judged only at the round's end, a replica draining at full width
			// after an outside review looked stuck to PitlaneReplicaNotSweeping). Only a claim
			// that went through has looked for due work: marked before it ran, a replica whose
			// every claim failed looked like it swept (an outside review, metrics).
			r.swept = true
			p.progress(true, 0)
		}
		if len(jobs) < reserved {
			r.exhausted[i] = true // everything due is claimed, here or by another replica
		}
		if h := s.cfg.Hooks.AfterSweepClaim; h != nil && src.kind == "session" && len(jobs) > 0 {
			ids := make([]string, len(jobs))
			for k, j := range jobs {
				ids[k] = j.id
			}
			h(r.ctx, ids)
		}
		for _, j := range jobs {
			r.inFlight++
			p.inFlight.Add(1)
			go r.drive(i, j, &driveSlot{pool: r.slots, held: true}) // one of the reserved
		}
		free -= len(jobs)
		if r.probing {
			r.probeSent += len(jobs)
		}
	}
}

// drive is one worker: it drives the row of source i it holds the lease of, and reports to done.
func (r *producer) drive(i int, j patrolJob, slot *driveSlot) {
	s, src := r.s, r.sources[i]
	f := finishedDrive{source: i, lease: heldLease{id: j.id, token: j.token}}
	defer func() { slot.handOff(); s.patrol.inFlight.Add(-1); r.done <- f }()
	if s.leaseSpent(j.leasedAt) {
		// The claim came back so late (a busy pool, a pooler's queue, a commit waiting for a
		// standby) that less than a gateway timeout of the lease is left: nothing is sent beside
		// the row's next holder. The row goes back due now, its schedule untouched (as a drive
		// cut by shutdown), for a claim with a whole lease; a source that releases its own rows
		// lets the lease run out.
		s.log.Warn("patrol: the lease was spent before its drive started; giving the row back",
			"kind", src.kind, "id", j.id, "claimed", j.leasedAt)
		f.end, f.interrupted = endDone, false
		if src.leases != nil {
			f.end, f.interrupted = endRelease, true
		}
		return
	}
	jctx, cancel := s.driveContext(context.WithValue(r.dctx, slotCtxKey{}, slot), j.leasedAt)
	f.end = s.runDrive(jctx, src.kind, j)
	f.interrupted = stopped(jctx) // the round's stop, not the drive's own deadline
	f.cut = f.interrupted
	cancel()
}

// wait waits for the next thing the producer acts on: a drive that finished (then every drive
// that finished meanwhile: one claim, then one release for all of them), the release in flight,
// a slot handed back, or the beat's tick (drives are slow, the gateway hangs: still beat on time).
func (r *producer) wait(tick <-chan time.Time) {
	select {
	case f := <-r.done:
		r.finished(f)
	case lost := <-r.releasing:
		r.rep.Lost += lost
		r.releasing = nil
	case <-r.slots.wake:
		return // a drive handed its slot back: claim for it
	case <-tick:
		return
	}
	for r.inFlight > 0 {
		select {
		case f := <-r.done:
			r.finished(f)
		default:
			return
		}
	}
}

// end reports the round once its drives finished and their leases are given back.
func (r *producer) end() (RoundReport, error) {
	s := r.s
	if calls, _ := r.stats.window(); r.probing && calls == 0 && r.ctx.Err() == nil && r.firstErr == nil {
		// The back-off ran out with nothing due at the gateway (or only customer messages): the
		// probe asked it nothing, and the back-off, its gauge and PitlanePatrolBackingOff's "the
		// gateway keeps failing" stayed for as long as nothing fell due — hours on a quiet night
		// after the gateway had long recovered (an outside review). One question that changes
		// nothing tells: answered, the back-off ends; not, it lengthens as a failed probe's does
		// (judgeRound).
		s.probeGateway(r.dctx)
		if !r.stats.failing(1) {
			r.probing = false
			s.endBackoff()
		}
	}
	r.rep.Calls, r.rep.Failed = int(r.stats.calls.Load()), int(r.stats.failed.Load())
	r.rep.Skipped = r.backingOff
	s.judgeRound(&r.rep, r.stats, r.probing, r.swept)
	return r.rep, r.firstErr
}

// judgeRound updates the back-off after a round: a round whose gateway calls mostly failed
// starts (or, after a failed probe, lengthens) a back-off; a round the gateway answered ends it.
func (s *Service) judgeRound(rep *RoundReport, stats *roundStats, probing, swept bool) {
	p := s.patrol
	now := s.cfg.Clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if swept {
		p.lastSweepAt = &now
	}
	minCalls := BackoffMinCalls
	if probing {
		minCalls = 1
	}
	if stats.failing(minCalls) {
		p.backoffLevel++
		d := min(PatrolBackoffBase<<min(p.backoffLevel-1, 16), PatrolBackoffMax)
		p.backoffUntil = now.Add(d)
		calls, failed := stats.window()
		p.backoffWhy = fmt.Sprintf("the gateway failed %d of its last %d calls", failed, calls)
		s.log.Warn("patrol: the gateway is failing; backing off", "until", p.backoffUntil, "calls", rep.Calls, "failed", rep.Failed)
	}
	rep.BackingOff = now.Before(p.backoffUntil)
	rep.BackoffUntil = p.backoffUntil
	if !rep.Skipped {
		p.last = *rep
	}
}

// probeReference is the reference of the patrol's health probe: no payment carries it.
const probeReference = "pitlane-health-probe"

// probeGateway asks the gateway for the payments of a reference no payment carries: a read that
// changes nothing, counted in the round's statistics and logged as a "probe" call (no session).
// A definitive refusal is an answer too (the gateway is up).
func (s *Service) probeGateway(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.GatewayTimeout)
	defer cancel()
	started := time.Now()
	found, err := s.gw.FindByReference(cctx, probeReference)
	s.logGatewayAnswer(ctx, "", "probe", "", started, err, fmt.Sprintf("%d payment(s) with the probe's reference", len(found)))
}

// endBackoff: a probe came back healthy.
func (s *Service) endBackoff() {
	p := s.patrol
	p.mu.Lock()
	p.backoffLevel, p.backoffWhy = 0, ""
	p.mu.Unlock()
}

// claimContext is a claim's (or a beat's) context: it does not end with ctx (the round's stop)
// at once, but a gateway timeout after it, and never lasts longer than a lease: a claim that
// takes longer leases nothing worth having, and with no bound of its own a statement on a
// database gone silent held the round, and the replica's patrol, until TCP gave up.
func (s *Service) claimContext(ctx context.Context) (context.Context, context.CancelFunc) {
	octx, stop := Outlive(ctx, s.cfg.GatewayTimeout)
	tctx, cancel := context.WithTimeout(octx, s.cfg.LeaseDuration)
	return tctx, func() { cancel(); stop() }
}

// driveContext bounds one drive: it ends one gateway timeout before the lease does. The lease
// runs from leasedAt, the claim's own time (lease_until = leasedAt + LeaseDuration), not from
// the drive's start: a claim the database answered late (a busy pool, a pooler's queue, a
// commit waiting for a standby) has less of its lease left, and a drive that outlived it would
// act beside the row's next holder (two Registers of one session, one of them answered
// idempotency_key_in_use, at best). The round bounds every job with it; a drive whose lease is
// already spent does not start (leaseSpent).
func (s *Service) driveContext(ctx context.Context, leasedAt time.Time) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.driveBudget()-s.cfg.Clock.Now().Sub(leasedAt))
}

// driveBudget is how long after its claim a drive may run: one gateway timeout less than the
// lease (at least half of it).
func (s *Service) driveBudget() time.Duration { return s.sendWithin(s.cfg.LeaseDuration) }

// sendWithin is how long after a claim work that calls the gateway may still start when nothing
// else may act on the row for window from the claim: one gateway timeout less (at least half the
// window), so the call is over by then.
func (s *Service) sendWithin(window time.Duration) time.Duration {
	return max(window-s.cfg.GatewayTimeout, window/2)
}

// leaseSpent: a row claimed at leasedAt has no drive budget left now.
func (s *Service) leaseSpent(leasedAt time.Time) bool {
	return s.cfg.Clock.Now().Sub(leasedAt) >= s.driveBudget()
}

// PatrolRound is one round of this replica's patrol over everything it drives — due sessions,
// pending refunds, webhook events whose apply failed, undelivered messages — through one pool,
// then its heartbeat.
func (s *Service) PatrolRound(ctx context.Context) (RoundReport, error) {
	return s.patrolRound(ctx, 0)
}

func (s *Service) patrolRound(ctx context.Context, beatEvery time.Duration) (RoundReport, error) {
	sources := []patrolSource{s.sessionSource(), s.refundSource(), s.webhookSource()}
	if s.cfg.Notifier != nil {
		sources = append(sources, s.outboxSource())
	}
	// A beat is not cut by the stop (the last one says what the round did), but, as a claim, a
	// gateway timeout after it (claimContext): under context.WithoutCancel alone, a database that
	// stopped answering (a network cut, a hung host) held the beat, the round and so the stop
	// of the replica until it answered again, past the unit's TimeoutStopSec (an outside review).
	bounded := func() {
		bctx, cancel := s.claimContext(ctx)
		defer cancel()
		s.beat(bctx)
	}
	var beat func()
	if beatEvery > 0 {
		beat = bounded
	}
	rep, err := s.runRound(ctx, sources, beat, beatEvery)
	bounded()
	return rep, err
}

// Heartbeat is one replica's patrol as its last heartbeat row says.
type Heartbeat struct {
	ReplicaID    string
	Version      string
	Concurrency  int
	StartedAt    time.Time
	BeatAt       time.Time
	LastSweepAt  *time.Time
	InFlight     int
	BackoffUntil *time.Time
	Reason       string
	LastDriven   int
	LastCalls    int
	LastFailed   int
	DrivenTotal  int64
	// ClockOffset is the replica's clock (as the service reads it: a server's is a DatabaseClock)
	// minus the database's when it last beat (nil: not measured, a replica of an earlier
	// release). Leases and deadlines are compared across replicas: more than a second apart is
	// a problem (PitlaneClockOffset).
	ClockOffset *time.Duration
}

// BackingOff reports whether the replica was backing off at now: waiting out a back-off, or,
// once it ran out, probing the gateway with a quarter of its width until a probe comes back
// healthy (the beat keeps the last back-off's end and its reason until then). The gauge read
// 0 while a probe waited on a gateway still down — up to a gateway timeout and a sweep interval
// each time — and each dip restarted PitlanePatrolBackingOff's 10 minutes (an outside review).
// Only while the row is fresh: a replica that has not beaten for ReplicaSilentAfter is silent,
// not backing off. A replica lost while it backed off (a host lost with its egress in trouble)
// otherwise read as backing off for the day its row lives, which silenced
// PitlaneReplicaNotSweeping for it (an outside review).
func (h Heartbeat) BackingOff(now time.Time) bool {
	return h.BackoffUntil != nil && now.Sub(h.BeatAt) < ReplicaSilentAfter &&
		(now.Before(*h.BackoffUntil) || h.Reason != "")
}

// Probing reports whether the replica's back-off had run out at now and it was probing the
// gateway (BackingOff).
func (h Heartbeat) Probing(now time.Time) bool {
	return h.BackingOff(now) && !now.Before(*h.BackoffUntil)
}

// beat writes this replica's heartbeat row. A failure is logged, never fatal: the patrol's work
// matters more than its report.
func (s *Service) beat(ctx context.Context) {
	p := s.patrol
	now := s.cfg.Clock.Now()
	p.mu.Lock()
	var until any
	if now.Before(p.backoffUntil) || p.backoffLevel > 0 { // backing off, or probing at its end
		until = p.backoffUntil
	}
	args := []any{s.cfg.ReplicaID, s.cfg.Version, s.cfg.SweepConcurrency, p.startedAt, now, p.lastSweepAt,
		p.inFlight.Load(), until, p.backoffWhy, p.last.Driven, p.last.Calls, p.last.Failed, p.drivenTotal}
	p.mu.Unlock()
	// The clock offset is this replica's time (read just before the statement) minus the
	// database's as the statement runs: a little below the truth by the time the statement
	// takes to arrive, which is what a lease compared across replicas sees too.
	args = append(args, s.cfg.Clock.Now())
	if _, err := s.db.Exec(ctx, `INSERT INTO sweeper_heartbeats (replica_id, version, concurrency, started_at, beat_at,
			last_sweep_at, in_flight, backoff_until, backoff_reason, last_round_driven, last_round_calls, last_round_failed, driven_total,
			clock_offset_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, round(extract(epoch FROM $14::timestamptz - clock_timestamp()) * 1000)::bigint)
		ON CONFLICT (replica_id) DO UPDATE SET version = $2, concurrency = $3, started_at = $4, beat_at = $5,
			last_sweep_at = $6, in_flight = $7, backoff_until = $8, backoff_reason = $9, last_round_driven = $10,
			last_round_calls = $11, last_round_failed = $12, driven_total = $13, clock_offset_ms = EXCLUDED.clock_offset_ms`, args...); err != nil {
		s.logPatrolError("patrol: heartbeat", err)
	}
}

// forgetHeartbeat removes this process's heartbeat row on a graceful shutdown (a newer process
// with the same REPLICA_ID keeps its own).
func (s *Service) forgetHeartbeat(ctx context.Context) {
	if _, err := s.db.Exec(ctx, `DELETE FROM sweeper_heartbeats WHERE replica_id = $1 AND started_at = $2`,
		s.cfg.ReplicaID, s.patrol.startedAt); err != nil {
		s.log.Error("patrol: forget heartbeat", "err", err)
	}
}

// HeartbeatRetention: rows of replicas that have not beaten for this long are reaped.
const HeartbeatRetention = 24 * time.Hour

// Heartbeats lists every replica's last heartbeat, by replica id.
func (s *Service) Heartbeats(ctx context.Context) ([]Heartbeat, error) {
	rows, err := s.db.Query(ctx, `SELECT replica_id, version, concurrency, started_at, beat_at, last_sweep_at, in_flight,
		backoff_until, backoff_reason, last_round_driven, last_round_calls, last_round_failed, driven_total, clock_offset_ms
		FROM sweeper_heartbeats ORDER BY replica_id LIMIT 1000`)
	if err != nil {
		return nil, fmt.Errorf("heartbeats: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Heartbeat, error) {
		var h Heartbeat
		var offsetMS *int64
		err := r.Scan(&h.ReplicaID, &h.Version, &h.Concurrency, &h.StartedAt, &h.BeatAt, &h.LastSweepAt, &h.InFlight,
			&h.BackoffUntil, &h.Reason, &h.LastDriven, &h.LastCalls, &h.LastFailed, &h.DrivenTotal, &offsetMS)
		if offsetMS != nil {
			d := time.Duration(*offsetMS) * time.Millisecond
			h.ClockOffset = &d
		}
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeats: %w", err)
	}
	return out, nil
}

// buildVersion names the running build: the module version and the VCS revision when known.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, st := range bi.Settings {
		if st.Key == "vcs.revision" && len(st.Value) >= 12 {
			v += "+" + st.Value[:12]
		}
	}
	if v == "" {
		v = "devel"
	}
	return v
}
