package payments

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
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
			token: c.token, gp: GatewayPayment{ID: c.sess.GatewayPaymentID, Status: GatewaySucceeded, Amount: 100, Currency: "EUR", Reference: c.sess.Reference()},
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

// An answer overtaken by a newer decision (the session moved on after its drive's claim, and the
// answer would open a case against the new state) writes nothing and is told so (staleAnswer: its
// drive asks the gateway again); the rest of the batch settles in one transaction.
func TestSettleBatchSkipsAnOvertakenAnswer(t *testing.T) {
	t.Parallel()
	f := newSettleFixture(t, 6)
	for _, it := range f.items {
		it.seen = it.sess.Status
	}
	odd := f.items[3]
	odd.gp.Status = GatewayAuthorized // given before a webhook completed the session
	if _, err := f.pool.Exec(context.Background(), `UPDATE payment_sessions SET status = 'Completed' WHERE id = $1`, odd.sess.ID); err != nil {
		t.Fatal(err)
	}
	f.svc.settleBatch(f.items)
	var stale *staleAnswer
	if !errors.As(odd.err, &stale) || stale.now.Status != StatusCompleted {
		t.Fatalf("overtaken answer: err = %v, want staleAnswer with the session Completed", odd.err)
	}
	others := f.completedExcept(t, odd)
	if n := f.count(t, `SELECT count(*) FROM finance_cases`); n != 0 {
		t.Fatalf("%d finance cases, want none", n)
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

// mixAnswers gives the fixture's answers every kind a plain settle has: Completed (order Paid,
// ledger), Failed (terminal: the order's active pointer let go), Authorized (not terminal: the
// next check scheduled), pending (no transition at all), and an Unknown session with no gateway
// id that the answer attaches (the transition's patch).
func mixAnswers(t *testing.T, f *settleFixture) {
	t.Helper()
	for i, it := range f.items {
		switch i % 5 {
		case 1:
			it.gp.Status = GatewayDeclined
		case 2:
			it.gp.Status = GatewayAuthorized
		case 3:
			it.gp.Status = GatewayPending
		case 4:
			if _, err := f.pool.Exec(context.Background(), `UPDATE payment_sessions SET status = 'Unknown', gateway_payment_id = NULL
				WHERE id = $1`, it.sess.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// snapshot is everything a settle writes, keyed by order (the fixtures' session ids differ).
func (f *settleFixture) snapshot(t *testing.T) string {
	t.Helper()
	var out strings.Builder
	for _, q := range []string{
		`SELECT s.order_id, s.status, coalesce(s.gateway_payment_id, ''), coalesce(s.confirmation_url, ''),
			coalesce(s.next_check_at::text, ''), s.check_attempts, coalesce(s.flagged_at::text, ''), s.updated_at::text,
			coalesce(s.lease_owner, ''), s.lease_until IS NULL, s.lease_token IS NULL
		FROM payment_sessions s ORDER BY 1`,
		`SELECT s.order_id, coalesce(e.from_status, ''), e.to_status, e.actor_kind, e.actor_id, e.reason, e.created_at::text
		FROM session_events e JOIN payment_sessions s ON s.id = e.session_id ORDER BY 1, 2, 3`,
		`SELECT o.order_id, o.status, coalesce(a.order_id, ''), coalesce(p.order_id, ''), o.updated_at::text
		FROM orders o LEFT JOIN payment_sessions a ON a.id = o.active_session_id LEFT JOIN payment_sessions p ON p.id = o.paid_session_id
		ORDER BY 1`,
		`SELECT a.order_id, s.order_id, a.entry_type, a.amount, a.currency, a.created_at::text
		FROM accounting_entries a JOIN payment_sessions s ON s.id = a.session_id ORDER BY 1`,
		`SELECT status, sum(delta) FROM session_status_deltas GROUP BY 1 HAVING sum(delta) <> 0 ORDER BY 1`,
		`SELECT day::text, currency, sum(received), sum(refunded), sum(entries) FROM ledger_day_deltas GROUP BY 1, 2 ORDER BY 1, 2`,
		`SELECT s.order_id, c.operation, c.outcome, coalesce(c.http_status, 0), c.latency_ms, c.detail, c.created_at::text
		FROM gateway_calls c JOIN payment_sessions s ON s.id = c.session_id ORDER BY 1`,
		`SELECT s.order_id, c.kind, c.detail FROM finance_cases c JOIN payment_sessions s ON s.id = c.session_id ORDER BY 1, 2`,
	} {
		rows, err := f.pool.Query(context.Background(), q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(&out, vals...)
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		out.WriteString("--\n")
	}
	return out.String()
}

// The batch writes its plain settles as statements over arrays; what it writes is exactly what
// one transaction per answer writes. Two twin fixtures get the same mixed answers: one settles
// them as a batch, the other one by one (applyOne); every row a settle touches — sessions,
// timeline, orders, ledger, status and ledger-day counters, call log, cases — must be the same.
func TestSettleBatchWritesWhatOneByOneWrites(t *testing.T) {
	t.Parallel()
	const n = 15
	batched, single := newSettleFixture(t, n), newSettleFixture(t, n)
	mixAnswers(t, batched)
	mixAnswers(t, single)
	batched.svc.settleBatch(batched.items)
	for _, it := range single.items {
		it.out, it.err = single.svc.applyOne(it.ctx, it.actor, it.sess, it.seen, it.gp, it.reason)
		if it.err == nil {
			it.call.committed = true
		}
	}
	for i := range batched.items {
		b, s := batched.items[i], single.items[i]
		if b.err != nil || s.err != nil {
			t.Fatalf("answer %d: batch %v, one by one %v", i, b.err, s.err)
		}
		if b.out.Status != s.out.Status || b.out.GatewayPaymentID != s.out.GatewayPaymentID || b.out.OrderID != s.out.OrderID {
			t.Errorf("answer %d: batch returned %s %q, one by one %s %q", i, b.out.Status, b.out.GatewayPaymentID, s.out.Status, s.out.GatewayPaymentID)
		}
	}
	if n := batched.transactions(t, batched.ids(batched.items)); n != 1 {
		t.Fatalf("the batch wrote in %d transactions, want 1", n)
	}
	got, want := batched.snapshot(t), single.snapshot(t)
	if got != want {
		t.Fatalf("the batch wrote\n%s\none by one wrote\n%s", got, want)
	}
	for _, status := range []string{"Completed", "Failed", "Authorized", "Registered"} {
		if !strings.Contains(got, " "+status+" ") {
			t.Errorf("the mix has no %s session: the comparison does not cover it", status)
		}
	}
}

// A batch's writes are a fixed number of statements, however many answers it carries: the call
// log in one INSERT, the transitions in one statement, the orders and ledger in one. Control:
// one statement per answer would be 3 × 12 here.
func TestSettleBatchWritesInAFixedNumberOfStatements(t *testing.T) {
	t.Parallel()
	f := newSettleFixture(t, 12)
	cfg, err := pgxpool.ParseConfig(f.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	log := &wireLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	svc := NewService(pool, f.svc.cfg)
	svc.settleBatch(f.items)
	f.completedExcept(t, nil)
	var stmts []string
	for _, b := range log.batches {
		stmts = append(stmts, b...)
	}
	stmts = append(stmts, log.alone...)
	// BEGIN, the two SET LOCALs, lock orders and sessions (one statement), call log, reverses
	// asked; transitions, orders and ledger; COMMIT.
	if len(stmts) != 9 {
		t.Fatalf("%d statements for a batch of 12:\n%s", len(stmts), strings.Join(stmts, "\n---\n"))
	}
}

// A drive whose answer takes its session to a terminal state gives its lease back in the
// transition's own UPDATE and counts the look there, as the producer's release would: the row
// needs no release statement of its own, and the drive tells the producer so (leaseWasEnded).
// A session that is still active keeps its lease for the release, which schedules its next look.
// Both ways of writing (a batch, one by one) do the same.
func TestSettleEndsTheLeaseOfATerminalSession(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{true, false} {
		f := newSettleFixture(t, 4)
		f.items[1].gp.Status = GatewayAuthorized // stays active
		f.items[2].gp.Status = GatewayDeclined   // Failed: terminal too
		if batched {
			f.svc.settleBatch(f.items)
		} else {
			for _, it := range f.items {
				it.out, it.err = f.svc.applyOne(it.ctx, it.actor, it.sess, "", it.gp, it.reason)
			}
		}
		for i, it := range f.items {
			if it.err != nil {
				t.Fatalf("batched %v, answer %d: %v", batched, i, it.err)
			}
			terminal := it.out.Status.Terminal()
			var owner string
			var attempts int
			var tokenGone bool
			if err := f.pool.QueryRow(context.Background(), `SELECT coalesce(lease_owner, ''), check_attempts, lease_token IS NULL
				FROM payment_sessions WHERE id = $1`, it.sess.ID).Scan(&owner, &attempts, &tokenGone); err != nil {
				t.Fatal(err)
			}
			if terminal != tokenGone || terminal != (owner == "") || terminal != (attempts == 1) || terminal != leaseWasEnded(it.ctx) {
				t.Errorf("batched %v, %s session: lease owner %q, token gone %v, looks %d, drive told %v; want the lease ended and the look counted only when terminal",
					batched, it.out.Status, owner, tokenGone, attempts, leaseWasEnded(it.ctx))
			}
		}
	}
}

// Two answers of one session in one batch: a drive that waited for its settle past its lease,
// and the drive of the claim that followed (the same replica claimed the session again). The
// lock matches the row through the new token, but the batch's map of locked sessions is by id:
// the stale answer passed as the lease holder, and its case and flag were written. Only the
// holder's answer is applied; the other finds its lease lost.
func TestSettleBatchAppliesOnlyTheLeaseHoldersAnswerOfTwo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newSettleFixture(t, 1)
	stale := f.items[0]
	// The stale drive heard another amount (a contradiction: a case and a flag if applied).
	stale.gp.Amount = 999
	clock := f.svc.cfg.Clock.(*ManualClock)
	clock.Advance(f.svc.cfg.LeaseDuration + time.Minute)
	if _, err := f.pool.Exec(ctx, `UPDATE payment_sessions SET next_check_at = $2 WHERE id = $1`, stale.sess.ID, clock.Now()); err != nil {
		t.Fatal(err)
	}
	again, err := f.svc.claimDue(ctx, 1)
	if err != nil || len(again) != 1 || again[0].token == stale.token {
		t.Fatalf("claim again: %+v %v", again, err)
	}
	fresh := &settleItem{ctx: withLease(ctx, stale.sess.ID, again[0].token), actor: stale.actor, sess: again[0].sess,
		token: again[0].token, gp: GatewayPayment{ID: stale.gp.ID, Status: GatewaySucceeded, Amount: 100, Currency: "EUR"},
		reason: "gateway says succeeded"}
	f.svc.settleBatch([]*settleItem{stale, fresh})
	if !errors.Is(stale.err, ErrLeaseLost) {
		t.Errorf("the stale answer: %v, want its lease lost", stale.err)
	}
	if fresh.err != nil || fresh.out.Status != StatusCompleted {
		t.Errorf("the holder's answer: %s %v", fresh.out.Status, fresh.err)
	}
	if n := f.count(t, `SELECT count(*) FROM finance_cases`); n != 0 {
		t.Errorf("%d cases written from an answer whose lease had ended", n)
	}
	if n := f.count(t, `SELECT count(*) FROM payment_sessions WHERE flagged_at IS NOT NULL`); n != 0 {
		t.Errorf("the stale answer flagged the session")
	}
}

// The events feed orders events by their transaction's id (feed.go). A settle batch that locked
// its first order (and so had its id) and then waited for another order of the batch, while a
// Check on a third order of the batch committed a transition with a newer id, then settled that
// payment over it: the payment's Authorized → Completed came before its Registered → Authorized
// in the feed and the events webhook (an outside review). Here batch-001's order is held by
// another transaction; the batch must not wait for it. Once a backend waits for a lock (the
// batch, before this change; after it, batch-001's own apply, the batch committed), a Check
// answers Authorized for batch-002; when the holder lets go, every payment's events in the feed
// chain from one status to the next. Negative control: the batch locking its orders with a plain
// FOR UPDATE (the main before this change) gives batch-002 Completed before Authorized.
func TestSettleBatchNeverWaitsForAnOrderAfterItsFirst(t *testing.T) {
	f := newSettleFixture(t, 3)
	ctx := context.Background()
	byOrder := map[string]*settleItem{}
	for _, it := range f.items {
		byOrder[it.sess.OrderID] = it
	}
	holder, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = 'batch-001' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { f.svc.settleBatch(f.items); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for waiting := 0; waiting == 0; {
		if time.Now().After(deadline) {
			t.Fatal("nothing ever waited for batch-001's order")
		}
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND a.datname = current_database()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	p := byOrder["batch-002"]
	if _, err := f.svc.applyOne(ctx, Actor{Kind: ActorAPI, ID: "shop"}, p.sess, "",
		GatewayPayment{ID: p.sess.GatewayPaymentID, Status: GatewayAuthorized, Amount: 100, Currency: "EUR"}, "check"); err != nil {
		t.Fatal(err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	for _, it := range f.items {
		if it.err != nil || it.out.Status != StatusCompleted {
			t.Fatalf("%s: %s %v", it.sess.OrderID, it.out.Status, it.err)
		}
		page, err := f.svc.PaymentFeed(ctx, it.sess.ID, "", MaxFeedRead)
		if err != nil {
			t.Fatal(err)
		}
		var story []string
		prev := ""
		for i, e := range page.Events {
			story = append(story, e.From+"→"+e.To)
			if i > 0 && e.From != prev {
				t.Fatalf("%s: the feed tells %v: not the payment's history", it.sess.OrderID, story)
			}
			prev = e.To
		}
	}
}
