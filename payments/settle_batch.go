package payments

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
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
	b.s.settleBatch(batch)
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

// settleQueue collects the plain settles of a batch (applyLocked) to send in one round trip.
type settleQueue struct {
	batch pgx.Batch
	// into is where the session being decided goes once batch has run; queued says applyLocked
	// queued its writes there (rather than writing them at once).
	into   *Session
	queued bool
}

// settleBatch writes every answer of items in one transaction, or, if that fails, each in one
// of its own. Each item's out and err are its result.
func (s *Service) settleBatch(items []*settleItem) {
	if len(items) == 1 {
		it := items[0]
		it.out, it.err = s.applyOne(it.ctx, it.actor, it.sess, it.gp, it.reason)
		return
	}
	ctx := context.WithoutCancel(items[0].ctx)
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
	reachedCommit := false
	err := s.inTx(ctx, "settle batch", func(tx pgx.Tx) (err error) {
		defer func() { reachedCommit = err == nil }()
		// The locks of the whole batch, every call's log row, and which sessions had a reverse
		// asked, in one round trip. Orders first, then sessions (THE lock order), each in the
		// database's order of their keys, so two batches never wait for each other in a cycle; a
		// session is locked only while it carries its drive's token (a lost lease: not locked,
		// not written).
		locked := make(map[string]Session, len(items))
		asked := make(map[string]bool)
		var b pgx.Batch
		b.Queue(`SELECT 1 FROM orders WHERE order_id = ANY($1) ORDER BY order_id FOR UPDATE`, orders)
		b.Queue(`SELECT `+sessionColumns+` FROM payment_sessions
			WHERE (id, lease_token) IN (SELECT u.i, u.t FROM unnest($1::uuid[], $2::uuid[]) AS u(i, t))
			ORDER BY id FOR UPDATE`, ids, tokens).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				sess, err := scanSession(rows)
				if err != nil {
					return fmt.Errorf("settle batch: lock sessions: %w", err)
				}
				locked[sess.ID] = sess
			}
			return rows.Err()
		})
		for _, it := range items {
			if it.call != nil {
				b.Queue(insertGatewayCall, it.call.args...)
			}
		}
		b.Queue(`SELECT DISTINCT session_id::text FROM reverse_operations WHERE session_id = ANY($1::uuid[])`, ids).Query(func(rows pgx.Rows) error {
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
			if !ok {
				it.err = ErrLeaseLost
				continue
			}
			if h := s.cfg.Hooks.AfterApplyLock; h != nil {
				h(it.ctx, cur.ID)
			}
			q.into, q.queued = &it.out, false
			out, err := s.applyLocked(traceSession(ctx, cur), tx, it.actor, cur, asked[cur.ID], it.gp, it.reason, now, q)
			if err != nil {
				return err
			}
			if !q.queued {
				it.out = out
			}
		}
		if q.batch.Len() > 0 {
			if err := tx.SendBatch(ctx, &q.batch).Close(); err != nil {
				return dbError("settle batch: write", err, "")
			}
		}
		return nil
	})
	if err == nil {
		for _, it := range items {
			if it.call != nil {
				it.call.committed = true
			}
		}
		return
	}
	// Apply each answer on its own. When the batch's commit itself failed its outcome is
	// unknown: the call rows it carried are written guarded (not twice), and applyOne finds
	// an answer the batch did apply already applied and writes nothing.
	s.log.Warn("settle batch failed; applying its answers one by one", "size", len(items), "err", err,
		"sessions", strings.Join(ids, ","))
	for _, it := range items {
		if it.call != nil && reachedCommit {
			s.writeCallLog(it.ctx, it.call.args, true)
			it.call.committed = true
		}
		it.out, it.err = s.applyOne(it.ctx, it.actor, it.sess, it.gp, it.reason)
	}
}
