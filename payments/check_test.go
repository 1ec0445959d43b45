package payments_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// registered creates an order with a Registered session and returns it.
func (b *bench) registered(t *testing.T, orderID string, amount int64) payments.Session {
	t.Helper()
	r, err := b.plain.Create(context.Background(), api, payments.CreateInput{OrderID: orderID, Amount: amount, Currency: "EUR", CustomerContact: "buyer@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Session.Status != payments.StatusRegistered {
		t.Fatalf("setup: status %s", r.Session.Status)
	}
	return r.Session
}

// secondPayment registers a second gateway payment under s's reference, as a gateway that
// ignored our idempotency key would have made it (pending).
func (b *bench) secondPayment(t *testing.T, s payments.Session) payments.GatewayPayment {
	t.Helper()
	b.gw.IgnoreKeys(true)
	defer b.gw.IgnoreKeys(false)
	second, err := b.gw.Register(context.Background(), payments.RegisterRequest{IdempotencyKey: s.ID, Reference: s.ID, Amount: s.Amount, Currency: s.Currency})
	if err != nil || second.ID == s.GatewayPaymentID {
		t.Fatalf("second registration: %+v %v", second, err)
	}
	return second
}

type checkOut struct {
	s   payments.Session
	err error
}

func goCheck(svc *payments.Service, id string) <-chan checkOut {
	ch := make(chan checkOut, 1)
	go func() {
		s, err := svc.Check(context.Background(), api, id)
		ch <- checkOut{s, err}
	}()
	return ch
}

// Two Checks, both told "succeeded" by the gateway and parked before applying; the first then
// holds the order and session locks while the second is seen waiting for them. One Completed
// transition, one PaymentReceived entry, order Paid once.
func TestCheckTwiceAppliesOnce(t *testing.T) {
	t.Parallel()
	afterGW := newParker()
	locked := newParker()
	b := newBench(t, func(c *payments.Config) {
		c.Hooks.AfterGatewayStatus = func(ctx context.Context, id string, _ payments.GatewayPayment) { afterGW.hook(ctx, id) }
		c.Hooks.AfterApplyLock = locked.hook
	})
	sess := b.registered(t, "o-check", 1999)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)

	c1 := goCheck(b.svc, sess.ID)
	c2 := goCheck(b.svc, sess.ID)
	mustWait(t, afterGW.arrived, "check 1 asked the gateway")
	mustWait(t, afterGW.arrived, "check 2 asked the gateway") // both heard "succeeded"
	afterGW.let(2)
	mustWait(t, locked.arrived, "one check holds the locks")
	waitLockWaiters(t, b.pool, 1) // the other waits for the order row
	locked.let(1)
	mustWait(t, locked.arrived, "the second check gets the locks after the first committed")
	locked.let(1)
	r1, r2 := mustWait(t, c1, "check 1"), mustWait(t, c2, "check 2")
	for _, r := range []checkOut{r1, r2} {
		if r.err != nil || r.s.Status != payments.StatusCompleted {
			t.Fatalf("check = %s, %v", r.s.Status, r.err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status = 'Completed'`, sess.ID); n != 1 {
		t.Fatalf("Completed transitions = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-check' AND entry_type = 'PaymentReceived'`); n != 1 {
		t.Fatalf("ledger entries = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM orders WHERE order_id = 'o-check' AND status = 'Paid' AND paid_session_id = $1`, sess.ID); n != 1 {
		t.Fatal("order not Paid by this session")
	}
}

// naiveApply is Check's apply without row locks and without a guarded UPDATE: read, decide,
// write. The negative control.
func naiveApply(ctx context.Context, pool *pgxpool.Pool, sess payments.Session, afterRead func(context.Context, string)) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var status string
	if err := tx.QueryRow(ctx, `SELECT status FROM payment_sessions WHERE id = $1`, sess.ID).Scan(&status); err != nil {
		return err
	}
	afterRead(ctx, sess.ID)
	if status == "Completed" {
		return nil
	}
	if _, err := tx.Exec(ctx, `UPDATE payment_sessions SET status = 'Completed' WHERE id = $1`, sess.ID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO accounting_entries (order_id, session_id, entry_type, amount, currency, created_at)
		VALUES ($1, $2, 'PaymentReceived', $3, $4, now())`, sess.OrderID, sess.ID, sess.Amount, sess.Currency); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// The negative control: the same schedule without row locks writes two entries (index dropped),
// or, with the index, the second Check dies on it instead of seeing the applied state.
func TestCheckNaiveWithoutLocksWritesTwice(t *testing.T) {
	t.Parallel()
	for _, withIndex := range []bool{false, true} {
		b := newBench(t)
		sess := b.registered(t, "o-naive", 500)
		if !withIndex {
			if _, err := b.pool.Exec(context.Background(), `DROP INDEX accounting_entries_one_payment_received`); err != nil {
				t.Fatal(err)
			}
		}
		p := newParker()
		errs := make(chan error, 2)
		for range 2 {
			go func() { errs <- naiveApply(context.Background(), b.pool, sess, p.hook) }()
		}
		mustWait(t, p.arrived, "read 1")
		mustWait(t, p.arrived, "read 2")
		p.let(2)
		e1, e2 := mustWait(t, errs, "apply 1"), mustWait(t, errs, "apply 2")
		n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-naive'`)
		if !withIndex {
			if e1 != nil || e2 != nil || n != 2 {
				t.Fatalf("naive without index: %v %v, entries %d; want 2 entries (the bug)", e1, e2, n)
			}
			continue
		}
		failed := e1
		if failed == nil {
			failed = e2
		}
		var pe *pgconn.PgError
		if !errors.As(failed, &pe) || pe.ConstraintName != "accounting_entries_one_payment_received" || n != 1 {
			t.Fatalf("naive with index: %v %v entries %d; want the unique index to refuse the second", e1, e2, n)
		}
	}
}

// Gateway answers never move a session backwards and a late success for a dead session opens a
// finance case with no money effect.
func TestCheckLateAndOutOfOrderAnswers(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()

	done := b.registered(t, "o-done", 100)
	b.gw.SetStatus(done.GatewayPaymentID, payments.GatewaySucceeded)
	if s, err := b.svc.Check(ctx, api, done.ID); err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("check: %s %v", s.Status, err)
	}
	b.gw.SetStatus(done.GatewayPaymentID, payments.GatewayAuthorized) // a late, stale answer
	if s, err := b.svc.Check(ctx, api, done.ID); err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("after stale authorized: %s %v", s.Status, err)
	}

	dead := b.registered(t, "o-dead", 100)
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewayDeclined)
	if s, _ := b.svc.Check(ctx, api, dead.ID); s.Status != payments.StatusFailed {
		t.Fatalf("declined → %s", s.Status)
	}
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded) // the money came anyway
	s, err := b.svc.Check(ctx, api, dead.ID)
	if err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("late success: %s %v", s.Status, err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-dead'`); n != 0 {
		t.Fatalf("late success wrote %d ledger entries", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID); n != 1 {
		t.Fatalf("late payment cases = %d", n)
	}
	// Asking again does not open a second case.
	if _, err := b.svc.Check(ctx, api, dead.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1`, dead.ID); n != 1 {
		t.Fatalf("cases after repeat = %d", n)
	}
	// The order is free for a new attempt after the failure.
	if r, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-dead", Amount: 100, Currency: "EUR"}); err != nil || !r.Created {
		t.Fatalf("new attempt after failure: %+v %v", r, err)
	}
}

// A gateway that does not answer leaves the session as it was and says so.
func TestCheckGatewayDownChangesNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sess := b.registered(t, "o-down", 100)
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	s, err := b.svc.Check(context.Background(), api, sess.ID)
	if payments.ErrorCode(err) != payments.EUNAVAIL || s.Status != payments.StatusRegistered {
		t.Fatalf("check with gateway down = %s, %v", s.Status, err)
	}
}

// A gateway that says our payment does not exist: the session is flagged for finance at once,
// with a case, and the patrol stops asking.
func TestCheckPaymentMissingAtGatewayFlagsAtOnce(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-missing", 100)
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET gateway_payment_id = 'gp_vanished' WHERE id = $1`, sess.ID); err != nil {
		t.Fatal(err)
	}
	s, err := b.svc.Check(ctx, api, sess.ID)
	if err != nil || s.Status != payments.StatusRegistered || s.FlaggedAt == nil || s.NextCheckAt != nil {
		t.Fatalf("check = %s flagged=%v next=%v err=%v", s.Status, s.FlaggedAt, s.NextCheckAt, err)
	}
	if b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, sess.ID) != 1 {
		t.Fatal("want a gateway_mismatch case")
	}
	b.clock.Advance(time.Hour)
	if n, _ := b.svc.SweepOnce(ctx); n != 0 {
		t.Fatal("the patrol still drives a flagged session")
	}
}
