package payments

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/attribute"
)

// Settle batching: group commit for the patrol's applies.
//
// After an outage the patrol's drives come back from the gateway many at once, each with an
// answer to write under its order and session locks. One transaction per answer is five round
// trips and a commit per session; where PostgreSQL, not the gateway, is the limit, that is the
// drain's ceiling (issue 10's benchmark against River, which completes its jobs in batches).
//
// So the answers of drives that finish together share one transaction, as concurrent commits
// share a WAL flush: a drive hands its answer to the replica's batcher and waits. If fewer than
// settleWidth settle transactions are running, it leads one at once with whatever answers are
// waiting (no timer, no added latency when the patrol is quiet); otherwise it waits until a
// transaction in flight ends and the baton passes to the oldest waiting answer, which leads the
// next batch with the answers that queued meanwhile. Every drive still gets its own result.
//
// What does not change: every session of a batch is written exactly as applyOne writes it —
// the same decision (applyLocked) over the session read under its order and session locks, taken
// for the whole batch in a fixed order (orders, then sessions, each sorted by the database), each
// session locked only while it still carries its drive's lease token. A plain settle (the
// transition, and for Completed the order's Paid status and ledger entry) is queued and sent for
// the whole batch in one round trip; anything else (cases, flags, reverses) is written as the
// session is decided. The batch commits or rolls back as a whole, and when it fails for any
// reason every answer in it is applied again in a transaction of its own (applyOne), so one bad
// session costs its neighbours a retry, never their answer.

// settleWidth is how many settle transactions one replica runs at once: one filling while the
// other commits keeps both PostgreSQL cores busy without spreading the answers into batches of one.
const settleWidth = 2

// settleItem is one drive's answer waiting for its settle transaction.
type settleItem struct {
	ctx    context.Context // the drive's: its lease, its call log slot, its span
	actor  Actor
	sess   Session
	seen   Status // sess's status when the gateway was asked ("": do not compare)
	token  string
	gp     GatewayPayment
	reason string
	call   *callLogSlot // the row of the gateway call the answer came from, if still to write

	out Session
	err error
	// wake is closed when the item was settled by another's batch or is to lead the next one.
	wake  chan struct{}
	leads bool
}

// settleBatcher is one replica's group commit of patrol answers. Its size is bounded by the
// patrol's width (one waiting item per drive), never per order.
type settleBatcher struct {
	s       *Service
	max     int // answers per transaction
	mu      sync.Mutex
	waiting []*settleItem
	active  int // settle transactions running
}

// settle applies one drive's answer through a batch and returns the drive's own result.
func (b *settleBatcher) settle(it *settleItem) (Session, error) {
	it.wake = make(chan struct{})
	b.mu.Lock()
	if b.active < settleWidth {
		b.active++
		batch := b.take(it)
		b.mu.Unlock()
		b.lead(batch)
		return it.out, it.err
	}
	b.waiting = append(b.waiting, it)
	b.mu.Unlock()
	<-it.wake
	if it.leads {
		b.mu.Lock()
		batch := b.take(it)
		b.mu.Unlock()
		b.lead(batch)
	}
	return it.out, it.err
}

// take makes a batch of first and the oldest waiting answers. Called with mu held.
func (b *settleBatcher) take(first *settleItem) []*settleItem {
	n := min(len(b.waiting), b.max-1)
	batch := append([]*settleItem{first}, b.waiting[:n]...)
	b.waiting = slices.Delete(b.waiting, 0, n)
	return batch
}

// lead settles batch (whose first item is the caller's), wakes the others, and passes the baton
// to the oldest waiting answer or gives up its transaction slot.
func (b *settleBatcher) lead(batch []*settleItem) {
	defer b.pass(batch)
	b.s.settleBatch(batch)
}

// pass wakes the batch's other answers and passes the baton — also when settleBatch panicked
// (an answer or a row the code does not expect): each answer of the batch then fails (its
// transaction was rolled back: a look, as for any failed apply) and the panic goes on to the
// leader's runDrive, which counts it as a look. Before, the slot was never given back and the
// batch's other answers never woken: two such panics and every later answer of the replica's
// patrol waited for ever, its rounds never ending (an outside review).
func (b *settleBatcher) pass(batch []*settleItem) {
	if r := recover(); r != nil {
		for _, it := range batch {
			it.out, it.err = Session{}, fmt.Errorf("settle batch: panic: %v", r)
		}
		defer panic(r)
	}
	for _, it := range batch[1:] {
		close(it.wake)
	}
	b.mu.Lock()
	if len(b.waiting) == 0 {
		b.active--
		b.mu.Unlock()
		return
	}
	next := b.waiting[0]
	b.waiting = slices.Delete(b.waiting, 0, 1)
	next.leads = true
	b.mu.Unlock()
	close(next.wake)
}

// settleQueue collects the plain settles of a batch (applyLocked) and writes them with one
// statement per kind of write for the whole batch (writePlain), not one per session.
type settleQueue struct {
	// into is where the session being decided goes once the queue is written; queued says
	// applyLocked queued its writes (rather than writing them at once).
	into   *Session
	queued bool
	plain  []plainSettle
}

// plainSettle is one session's transition, and for Completed its order's Paid status and ledger
// entry, waiting to be written with the batch's others.
type plainSettle struct {
	into   *Session
	cur    Session // as read under its locks
	to     Status
	actor  Actor
	reason string
	patch  sessionPatch
}

func (q *settleQueue) add(cur Session, to Status, actor Actor, reason string, patch sessionPatch) error {
	if len(allowedFrom(to)) == 0 {
		return Errorf(ECONFLICT, "no transition leads to %s", to)
	}
	q.plain = append(q.plain, plainSettle{into: q.into, cur: cur, to: to, actor: actor, reason: reason, patch: patch})
	q.queued = true
	return nil
}

// writePlain writes every queued settle in one round trip of at most two statements, whatever
// the batch's size: every transition with its timeline event (and, entering a terminal state
// other than Completed, the order's active pointer let go), then every Completed order marked
// Paid with its PaymentReceived entry. They are applyTransition's and completeOrder's statements
// over arrays, with the same guards per row: a session moves only from a state its edge allows,
// an order is paid only while awaiting payment through that very session. Any row a guard
// refuses fails the whole write (the counts must match), and with it the batch's transaction; the
// batch's answers are then applied one by one (settleBatch), where each refusal becomes that
// answer's own error. The per-row triggers (status counts, ledger day totals, live updates) fire
// for every row as they would one statement at a time. The single-row statements stay as they
// are for one session (applyTransition, completeOrder): sent with one-element arrays, these cost
// a Create about a third of its rate (576/s against 820–1,250/s, with PostgreSQL's CPU per Create
// doubled), so the two forms are kept, and TestSettleBatchWritesWhatOneByOneWrites holds them
// equal row for row.
func (q *settleQueue) writePlain(ctx context.Context, tx pgx.Tx, now time.Time) error {
	n := len(q.plain)
	if n == 0 {
		return nil
	}
	var (
		ids, tos, gpids, urls, froms, kinds, actors, reasons []string
		nexts                                                []pgtype.Timestamptz
		clears, releases, ends                               []bool
		paidOrders, paidSessions, paidCurrencies             []string
		paidAmounts                                          []int64
	)
	byID := make(map[string]*Session, n)
	for _, p := range q.plain {
		from := allowedFrom(p.to)
		fromList := make([]string, len(from))
		for i, f := range from {
			fromList[i] = string(f)
		}
		next := pgtype.Timestamptz{}
		if p.patch.nextCheckAt != nil {
			next = pgtype.Timestamptz{Time: *p.patch.nextCheckAt, Valid: true}
		}
		ids = append(ids, p.cur.ID)
		tos = append(tos, string(p.to))
		gpids = append(gpids, p.patch.gatewayPaymentID)
		urls = append(urls, p.patch.confirmationURL)
		nexts = append(nexts, next)
		clears = append(clears, p.patch.clearNextCheck || p.to.Terminal())
		froms = append(froms, strings.Join(fromList, ","))
		kinds = append(kinds, string(p.actor.Kind))
		actors = append(actors, p.actor.ID)
		reasons = append(reasons, p.reason)
		releases = append(releases, p.to.Terminal() && p.to != StatusCompleted)
		ends = append(ends, p.patch.endLease && p.to.Terminal())
		byID[p.cur.ID] = p.into
		if p.to == StatusCompleted {
			paidOrders = append(paidOrders, p.cur.OrderID)
			paidSessions = append(paidSessions, p.cur.ID)
			paidAmounts = append(paidAmounts, p.cur.Amount)
			paidCurrencies = append(paidCurrencies, p.cur.Currency)
		}
	}
	var b pgx.Batch
	moved := 0
	b.Queue(`
		WITH r AS (
			SELECT * FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::bool[],
				$7::text[], $8::text[], $9::text[], $10::text[], $11::bool[], $13::bool[])
				AS r(r_id, r_to, r_gpid, r_url, r_next, r_clear, r_from, r_kind, r_actor, r_reason, r_release, r_end)
		),
		prev AS (SELECT ps.id AS p_id, ps.status AS p_status FROM payment_sessions ps JOIN r ON ps.id = r.r_id),
		upd AS (
			UPDATE payment_sessions SET
				status = r.r_to,
				gateway_payment_id = CASE WHEN r.r_gpid = '' THEN gateway_payment_id ELSE r.r_gpid END,
				confirmation_url = CASE WHEN r.r_url = '' THEN confirmation_url ELSE r.r_url END,
				next_check_at = CASE WHEN r.r_clear THEN NULL WHEN r.r_next IS NOT NULL THEN r.r_next ELSE next_check_at END,
				lease_owner = CASE WHEN r.r_end THEN NULL ELSE lease_owner END,
				lease_until = CASE WHEN r.r_end THEN NULL ELSE lease_until END,
				lease_token = CASE WHEN r.r_end THEN NULL ELSE lease_token END,
				check_attempts = check_attempts + CASE WHEN r.r_end THEN 1 ELSE 0 END,
				updated_at = $12
			FROM r WHERE payment_sessions.id = r.r_id AND payment_sessions.status = ANY(string_to_array(r.r_from, ','))
			RETURNING `+sessionColumns+`
		),
		ev AS (
			INSERT INTO session_events (session_id, from_status, to_status, actor_kind, actor_id, reason, created_at)
			SELECT r.r_id, prev.p_status, r.r_to, r.r_kind, r.r_actor, r.r_reason, $12
			FROM r JOIN prev ON prev.p_id = r.r_id JOIN upd ON upd.id::uuid = r.r_id
		),
		released AS (
			UPDATE orders SET active_session_id = NULL, updated_at = $12
			FROM upd JOIN r ON r.r_id = upd.id::uuid
			WHERE r.r_release AND orders.order_id = upd.order_id AND orders.active_session_id = r.r_id
		)
		SELECT upd.* FROM upd`,
		ids, tos, gpids, urls, nexts, clears, froms, kinds, actors, reasons, releases, now, ends).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			sess, err := scanSession(rows)
			if err != nil {
				return fmt.Errorf("settle batch: transitions: %w", err)
			}
			if into := byID[sess.ID]; into != nil {
				*into = sess
				moved++
			}
		}
		return rows.Err()
	})
	if len(paidOrders) > 0 {
		b.Queue(`WITH r AS (
				SELECT * FROM unnest($1::text[], $2::text[]::uuid[], $3::bigint[], $4::text[]) AS r(r_order, r_session, r_amount, r_currency)
			),
			paid AS (
				UPDATE orders SET status = 'Paid', paid_session_id = r.r_session, active_session_id = NULL, updated_at = $5
				FROM r WHERE orders.order_id = r.r_order AND orders.status = 'AwaitingPayment' AND orders.active_session_id = r.r_session
				RETURNING r.r_order, r.r_session, r.r_amount, r.r_currency)
			INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, created_at)
			SELECT r_order, r_session, 'PaymentReceived', r_amount, r_currency, $5 FROM paid`,
			paidOrders, paidSessions, paidAmounts, paidCurrencies, now).Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != int64(len(paidOrders)) {
				return fmt.Errorf("complete: %d of %d orders were awaiting payment through their session (invariant broken)",
					tag.RowsAffected(), len(paidOrders))
			}
			return nil
		})
	}
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return dbError("settle batch: write", err, "")
	}
	if moved != n {
		// Some edge was not allowed from its session's state: nothing of this write may commit.
		return fmt.Errorf("settle batch: %d of %d transitions allowed: %w", moved, n, errNoTransition)
	}
	return nil
}

// queueCallLogs queues the call-log rows of a batch (each a callLogSlot's args, as
// logGatewayAnswer built them: a slot always has its session) as one INSERT over arrays. Each
// column is a typed slice: pgx encodes a []any only in its extended protocol with the server's
// parameter types at hand, and the exec mode pgbouncer's transaction pooling wants refused it,
// so every batch fell back to one transaction per answer (an outside review).
//
// Ids go as text arrays cast on the server ($1::text[]::uuid[]), here and in every statement
// of a batch or a patrol release: pgx encodes a []string for a uuid[] parameter only after its
// binary attempt fails, and that failure's error formats the whole slice with %#v first —
// ~9 µs against ~1 µs for a text[] of 11 ids (formatting those errors alone took 0.65 s of
// the sweeper figure's 14 s of Go CPU in a profile).
func queueCallLogs(b *pgx.Batch, calls [][]any) {
	var (
		sids, ops, keys, outcomes, details, replicas []string
		statuses                                     []int32
		latencies                                    []int64
		ats                                          []time.Time
	)
	for _, a := range calls {
		sids = append(sids, a[0].(string))
		ops = append(ops, a[1].(string))
		keys = append(keys, a[2].(string))
		outcomes = append(outcomes, a[3].(string))
		statuses = append(statuses, int32(a[4].(int)))
		latencies = append(latencies, a[5].(int64))
		details = append(details, a[6].(string))
		replicas = append(replicas, a[7].(string))
		ats = append(ats, a[8].(time.Time))
	}
	b.Queue(`INSERT INTO gateway_calls
			(session_id, operation, idempotency_key, outcome, http_status, latency_ms, detail, replica_id, created_at)
		SELECT s, o, k, oc, nullif(st, 0), l, d, r, c
		FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::text[], $5::int[], $6::bigint[], $7::text[], $8::text[], $9::timestamptz[])
			AS u(s, o, k, oc, st, l, d, r, c)`,
		sids, ops, keys, outcomes, statuses, latencies, details, replicas, ats).Exec(func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != int64(len(calls)) {
			return fmt.Errorf("settle batch: %d of %d call log rows written", tag.RowsAffected(), len(calls))
		}
		return nil
	})
}

// settleBatch writes every answer of items in one transaction, or, if that fails, each in one
// of its own. Each item's out and err are its result.
func (s *Service) settleBatch(items []*settleItem) {
	if len(items) == 1 {
		it := items[0]
		it.out, it.err = s.applyOne(it.ctx, it.actor, it.sess, it.seen, it.gp, it.reason)
		return
	}
	ctx := items[0].ctx // its leader's record context (detachRecord: bounded past its drive); its items wait for it
	ctx, span := s.startSpan(ctx, "payments.apply_batch", "", "")
	span.SetAttributes(attribute.Int("pitlane.batch_size", len(items)))
	defer span.End()
	now := s.cfg.Clock.Now()
	orders := make([]string, len(items))
	ids := make([]string, len(items))
	tokens := make([]string, len(items))
	for i, it := range items {
		orders[i], ids[i], tokens[i] = it.sess.OrderID, it.sess.ID, it.token
	}
	var unbatched []*settleItem // their orders were locked by another transaction: applied alone
	mayHaveCommitted, err := s.inTxCommit(ctx, "settle batch", func(tx pgx.Tx) error {
		unbatched = unbatched[:0]
		// The locks of the whole batch, every call's log row, and which sessions had a reverse
		// asked, in one round trip. Orders first, then sessions (THE lock order); a session is
		// locked only while it carries its drive's token (a lost lease: not locked, not written).
		//
		// The orders are locked SKIP LOCKED, never waited for: locking the first one gives the
		// batch its transaction id, and the events feed orders events by it (feed.go). Waiting
		// for a later order after that, while another transaction (a Check, a webhook) locks and
		// changes a third order of the batch and commits with a newer id, and then settling that
		// payment over it, would put the batch's later event of that payment before the other's
		// earlier one in the feed and the events webhook (an outside review: Authorized after
		// Completed). An item whose order another transaction holds is applied on its own after
		// the batch (applyOne: it waits for the order before its transaction has an id).
		locked := make(map[string]Session, len(items))
		asked := make(map[string]bool)
		var b pgx.Batch
		b.Queue(`SELECT `+sessionColumns+` FROM payment_sessions
			WHERE (id, lease_token) IN (SELECT u.i, u.t FROM unnest($1::text[]::uuid[], $2::text[]::uuid[]) AS u(i, t))
			  AND order_id = ANY(ARRAY(SELECT order_id FROM orders WHERE order_id = ANY($3) ORDER BY order_id FOR UPDATE SKIP LOCKED))
			ORDER BY payment_sessions.id FOR UPDATE`, ids, tokens, orders).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				sess, err := scanSession(rows)
				if err != nil {
					return fmt.Errorf("settle batch: lock sessions: %w", err)
				}
				locked[sess.ID] = sess
			}
			return rows.Err()
		})
		// Two answers of one session in a batch: a drive that waited here past its lease and the
		// drive of the claim that followed it. The lock above matched the row through the
		// current token, but the map is by id; which of the two holds the lease is read under
		// the lock (only then: it is rare, and it costs a statement).
		holder := map[string]string{}
		seen := make(map[string]bool, len(items))
		for _, it := range items {
			if seen[it.sess.ID] {
				if _, queued := holder[it.sess.ID]; !queued {
					holder[it.sess.ID] = ""
					id := it.sess.ID
					b.Queue(`SELECT coalesce(lease_token::text, '') FROM payment_sessions WHERE id = $1`, id).QueryRow(func(r pgx.Row) error {
						var tok string
						err := r.Scan(&tok)
						holder[id] = tok
						return err
					})
				}
			}
			seen[it.sess.ID] = true
		}
		var calls [][]any
		for _, it := range items {
			if it.call != nil {
				calls = append(calls, it.call.args)
			}
		}
		if len(calls) > 0 {
			queueCallLogs(&b, calls)
		}
		b.Queue(`SELECT DISTINCT session_id::text FROM reverse_operations WHERE session_id = ANY($1::text[]::uuid[])`, ids).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					return fmt.Errorf("settle batch: reverse ops: %w", err)
				}
				asked[id] = true
			}
			return rows.Err()
		})
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return dbError("settle batch: lock", err, "")
		}
		q := &settleQueue{}
		for _, it := range items {
			cur, ok := locked[it.sess.ID]
			tok, dup := holder[it.sess.ID]
			switch {
			case dup && tok != it.token:
				it.err = ErrLeaseLost
				continue
			case !ok:
				// Its order was held by another transaction (or its lease is lost, which
				// applyOne finds under the locks).
				unbatched = append(unbatched, it)
				continue
			}
			if h := s.cfg.Hooks.AfterApplyLock; h != nil {
				h(it.ctx, cur.ID)
			}
			q.into, q.queued = &it.out, false
			// The item's own lease (the batch's ctx is its leader's): applyLocked ends it with a
			// terminal transition (sessionPatch.endLease).
			ictx := context.WithValue(s.traceSession(ctx, cur), leaseCtxKey{}, it.ctx.Value(leaseCtxKey{}))
			out, err := s.applyLocked(ictx, tx, it.actor, cur, it.seen, asked[cur.ID], it.gp, it.reason, now, q, false)
			var stale *staleAnswer
			if errors.As(err, &stale) {
				it.err = err // nothing written for it: its drive asks again (applyGatewayPayment)
				continue
			}
			if err != nil {
				return err
			}
			if !q.queued {
				it.out = out
			}
		}
		return q.writePlain(ctx, tx, now)
	})
	if err == nil {
		alone := make(map[*settleItem]bool, len(unbatched))
		for _, it := range unbatched {
			alone[it] = true
		}
		for _, it := range items {
			if it.call != nil {
				it.call.committed = true
			}
			if it.err == nil && !alone[it] {
				leaseEnded(it.ctx, it.out)
			}
		}
		for _, it := range unbatched {
			it.out, it.err = s.applyOne(it.ctx, it.actor, it.sess, it.seen, it.gp, it.reason)
		}
		return
	}
	// Apply each answer on its own. When the batch's commit itself failed its outcome is
	// unknown: the call rows it carried are written guarded (not twice), and applyOne finds
	// an answer the batch did apply already applied and writes nothing.
	s.log.Warn("settle batch failed; applying its answers one by one", "size", len(items), "err", err,
		"sessions", strings.Join(ids, ","))
	for _, it := range items {
		if it.call != nil && mayHaveCommitted {
			s.writeCallLog(it.ctx, it.call.args, true)
			it.call.committed = true
		}
		it.out, it.err = s.applyOne(it.ctx, it.actor, it.sess, it.seen, it.gp, it.reason)
	}
}
