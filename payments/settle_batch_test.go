package payments

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
)

// settleFixture is n due Registered sessions (one order each, a payment "gp-<i>" at the gateway)
// claimed by a patrol, and the drives' answers ready to settle: every payment succeeded.
type settleFixture struct {
	pool  *pgxpool.Pool
	svc   *Service
	items []*settleItem
}

func newSettleFixture(t *testing.T, n int, mod ...func(*Config)) *settleFixture {
	t.Helper()
	ctx := context.Background()
	pool := testdb.New(t)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cfg := Config{Clock: NewManualClock(now), ReplicaID: "batch-test", LockTimeout: 10 * time.Second}
	for _, m := range mod {
		m(&cfg)
	}
	svc := NewService(pool, cfg)
	for i := range n {
		id, order := uuid.NewString(), fmt.Sprintf("batch-%03d", i)
		if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id, active_session_id, created_at, updated_at) VALUES ($1, $2, $3, $3)`,
			order, id, now.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, gateway_payment_id,
				next_check_at, created_at, updated_at) VALUES ($1, $2, 100, 'EUR', 'Registered', 'fake', $3, $4, $4, $4)`,
			id, order, fmt.Sprintf("gp-%03d", i), now.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := svc.claimDue(ctx, n)
	if err != nil || len(claimed) != n {
		t.Fatalf("claim: %d of %d, %v", len(claimed), n, err)
	}
	f := &settleFixture{pool: pool, svc: svc}
	for _, c := range claimed {
		// The drive's context: its lease, and the slot of its gateway call's log row (check's
		// deferCallLog), which the item carries too.
		call := &callLogSlot{args: []any{c.sess.ID, "status", "", "ok", 0, int64(1), "gateway says succeeded", "batch-test", now}}
		ctx := context.WithValue(withLease(ctx, c.sess.ID, c.token), callLogKey{}, call)
		f.items = append(f.items, &settleItem{ctx: ctx, actor: Actor{Kind: ActorSweeper, ID: "batch-test"}, sess: c.sess,
			token: c.token, gp: GatewayPayment{ID: c.sess.GatewayPaymentID, Status: GatewaySucceeded, Amount: 100, Currency: "EUR"},
			reason: "gateway says succeeded", call: call})
	}
	return f
}

func (f *settleFixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// transactions counts the transactions that wrote the Completed events of the given sessions
// (the xmin of a row is the transaction that inserted it).
func (f *settleFixture) transactions(t *testing.T, ids []string) int {
	t.Helper()
	return f.count(t, `SELECT count(DISTINCT xmin::text) FROM session_events WHERE to_status = 'Completed' AND session_id = ANY($1::uuid[])`, ids)
}

// completedExcept checks that every item but odd settled Completed, and returns them.
func (f *settleFixture) completedExcept(t *testing.T, odd *settleItem) []*settleItem {
	t.Helper()
	var out []*settleItem
	for _, it := range f.items {
		if it == odd {
			continue
		}
		if it.err != nil || it.out.Status != StatusCompleted {
			t.Fatalf("%s: %s, %v", it.sess.ID, it.out.Status, it.err)
		}
		out = append(out, it)
	}
	return out
}

func (f *settleFixture) ids(items []*settleItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.sess.ID
	}
	return out
}

// A batch of answers is written in ONE transaction, each exactly as a transaction of its own
// would write it: Completed with its timeline event, the order Paid, one PaymentReceived entry.
func TestSettleBatchWritesEveryAnswerInOneTransaction(t *testing.T) {
	t.Parallel()
	f := newSettleFixture(t, 12)
	f.svc.settleBatch(f.items)
	f.completedExcept(t, nil)
	ids := f.ids(f.items)
	if n := f.transactions(t, ids); n != 1 {
		t.Fatalf("the batch wrote in %d transactions, want 1", n)
	}
	if n := f.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'PaymentReceived' AND session_id = ANY($1::uuid[])`, ids); n != 12 {
		t.Fatalf("%d PaymentReceived entries, want 12", n)
	}
	if n := f.count(t, `SELECT count(*) FROM orders WHERE status = 'Paid' AND active_session_id IS NULL AND paid_session_id = ANY($1::uuid[])`, ids); n != 12 {
		t.Fatalf("%d orders paid, want 12", n)
	}
	if n := f.count(t, `SELECT count(*) FROM session_events WHERE from_status = 'Registered' AND to_status = 'Completed' AND actor_kind = 'sweeper'`); n != 12 {
		t.Fatalf("%d timeline events, want 12", n)
	}
	if n := f.count(t, `SELECT count(*) FROM gateway_calls WHERE session_id = ANY($1::uuid[])`, ids); n != 12 {
		t.Fatalf("%d call log rows, want 12", n)
	}
}

// A session whose lease was taken over between the claim and the settle is neither locked nor
// written: its drive is told ErrLeaseLost, and the rest of the batch settles in one transaction.
func TestSettleBatchSkipsASessionWhoseLeaseWasLost(t *testing.T) {
	t.Parallel()
	f := newSettleFixture(t, 6)
	lost := f.items[2]
	if _, err := f.pool.Exec(context.Background(), `UPDATE payment_sessions SET lease_token = gen_random_uuid() WHERE id = $1`, lost.sess.ID); err != nil {
		t.Fatal(err)
	}
	f.svc.settleBatch(f.items)
	if !errors.Is(lost.err, ErrLeaseLost) {
		t.Fatalf("lost lease: err = %v, want ErrLeaseLost", lost.err)
	}
	others := f.completedExcept(t, lost)
	if n := f.count(t, `SELECT count(*) FROM payment_sessions WHERE id = $1 AND status = 'Registered'`, lost.sess.ID); n != 1 {
		t.Fatal("the session whose lease was lost was written")
	}
	if n := f.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, lost.sess.ID); n != 0 {
		t.Fatal("the session whose lease was lost got a ledger entry")
	}
	if n := f.transactions(t, f.ids(others)); n != 1 {
		t.Fatalf("the others settled in %d transactions, want 1", n)
	}
}

// One answer that cannot be written (its order is no longer awaiting payment through it: the
// ledger's invariant refuses) fails the batch's transaction; every other answer is then applied
// in a transaction of its own and settles, and only the bad one reports an error. Without the
// fallback the good answers would be lost with the bad one.
func TestSettleBatchFallsBackToOneByOneWhenTheBatchFails(t *testing.T) {
	t.Parallel()
	f := newSettleFixture(t, 5)
	bad := f.items[3]
	if _, err := f.pool.Exec(context.Background(), `UPDATE orders SET active_session_id = NULL WHERE order_id = $1`, bad.sess.OrderID); err != nil {
		t.Fatal(err)
	}
	f.svc.settleBatch(f.items)
	if bad.err == nil {
		t.Fatal("the answer that breaks the ledger invariant reported no error")
	}
	good := f.completedExcept(t, bad)
	if n := f.count(t, `SELECT count(*) FROM payment_sessions WHERE id = $1 AND status = 'Registered'`, bad.sess.ID); n != 1 {
		t.Fatal("the bad session was half-written")
	}
	if n := f.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = ANY($1::uuid[])`, f.ids(good)); n != 4 {
		t.Fatalf("%d ledger entries for the 4 good answers", n)
	}
	if n := f.transactions(t, f.ids(good)); n != 4 {
		t.Fatalf("the good answers settled in %d transactions, want one each (4) after the batch failed", n)
	}
	// Every good answer's call log row exactly once, whichever transaction carried it (the batch
	// that rolled back, then its own).
	if n := f.count(t, `SELECT count(*) FROM gateway_calls WHERE session_id = ANY($1::uuid[])`, f.ids(good)); n != 4 {
		t.Fatalf("%d call log rows for the 4 good answers", n)
	}
}

// An answer that is not a plain settle (here: the gateway's amount contradicts ours, so the
// session is flagged with a finance case and not completed) is written as it is decided, in the
// same transaction as the plain ones.
func TestSettleBatchWritesCasesInTheSameTransaction(t *testing.T) {
	t.Parallel()
	f := newSettleFixture(t, 4)
	odd := f.items[1]
	odd.gp.Amount = 999
	f.svc.settleBatch(f.items)
	if odd.err != nil || odd.out.Status != StatusRegistered || odd.out.FlaggedAt == nil {
		t.Fatalf("mismatched answer: %s flagged %v, %v", odd.out.Status, odd.out.FlaggedAt, odd.err)
	}
	plain := f.completedExcept(t, odd)
	if n := f.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2
		AND xmin = (SELECT xmin FROM session_events WHERE session_id = $3 AND to_status = 'Completed')`,
		odd.sess.ID, CaseGatewayMismatch, plain[0].sess.ID); n != 1 {
		t.Fatal("the mismatch case was not written in the batch's transaction")
	}
	if n := f.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, odd.sess.ID); n != 0 {
		t.Fatal("a mismatched answer moved money")
	}
}

// The batcher: while settleWidth transactions are in flight, answers that arrive wait and are
// then written together — at most settleWidth transactions for all of them, not one each. The
// two first answers are parked inside their transactions (AfterApplyLock) until the rest queue.
// Control: with SettleBatch 1 (no batcher) the same answers take one transaction each.
func TestSettleBatcherGroupsAnswersThatArriveWhileBusy(t *testing.T) {
	t.Parallel()
	for _, batching := range []bool{true, false} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			t.Parallel()
			parked := make(chan string, settleWidth)
			release := make(chan struct{})
			var once sync.Once
			first := map[string]bool{}
			f := newSettleFixture(t, 10, func(c *Config) {
				if !batching {
					c.SettleBatch = 1
				}
				c.Hooks.AfterApplyLock = func(ctx context.Context, id string) {
					if first[id] {
						parked <- id
						<-release
					}
				}
			})
			for _, it := range f.items[:settleWidth] {
				first[it.sess.ID] = true
			}
			var wg sync.WaitGroup
			apply := func(it *settleItem) {
				defer wg.Done()
				it.out, it.err = f.svc.applyGatewayPayment(it.ctx, it.actor, it.sess, it.gp, it.reason)
			}
			for _, it := range f.items[:settleWidth] {
				wg.Add(1)
				go apply(it)
			}
			for range settleWidth {
				<-parked
			}
			rest := f.items[settleWidth:]
			for _, it := range rest {
				wg.Add(1)
				go apply(it)
			}
			if batching {
				// Every later answer waits in the queue (nothing else can happen to it while
				// both transactions are parked).
				deadline := time.Now().Add(20 * time.Second)
				for {
					f.svc.settles.mu.Lock()
					n := len(f.svc.settles.waiting)
					f.svc.settles.mu.Unlock()
					if n == len(rest) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%d of %d answers queued", n, len(rest))
					}
					runtime.Gosched()
				}
				once.Do(func() { close(release) })
			} else {
				close(release)
			}
			wg.Wait()
			f.completedExcept(t, nil)
			n := f.transactions(t, f.ids(rest))
			if batching && n > settleWidth {
				t.Fatalf("%d answers that queued settled in %d transactions, want at most %d", len(rest), n, settleWidth)
			}
			if !batching && n != len(rest) {
				t.Fatalf("control: %d answers settled in %d transactions, want one each", len(rest), n)
			}
		})
	}
}
