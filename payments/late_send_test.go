package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A Create whose claim the database answered late (a busy pool, a lock wait: here 15 s, still
// inside the window in which it may send) sends its registration, and its replica dies before
// any answer. The session was due RegisterGrace after its claim — 15 s after the send, not
// RegisterGrace — and the next replica's patrol looked up by reference (nothing yet: the request
// still being processed) and registered again beside it: two payments at a gateway that ignores
// keys. A late send holds the session RegisterGrace past itself first. Negative control (run by
// hand): without the hold, two payments.
func TestALateClaimsRegistrationIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	b.gw.IgnoreKeys(true)
	var sent time.Time
	a := b.service(b.pool, "replica-dies", func(c *payments.Config) {
		c.Hooks.BeforeRegister = func(context.Context, string) {
			b.clock.Advance(15 * time.Second) // the claim answered late
			sent = b.clock.Now()
		}
	})
	held := b.gw.Hold(fakegw.OpRegister)
	done := make(chan error, 1)
	go func() {
		_, err := a.Create(context.Background(), api, payments.CreateInput{OrderID: "o-late-claim", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
		done <- err
	}()
	id := mustWait(t, held.Arrived(), "the Create's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	// The replica is gone: nothing it would write after the send is written. The gateway
	// answers the request when the test opens the gate.
	processed := make(chan struct{})
	go func() { <-done; close(processed) }()
	b.wantNoRegistrationBeside(t, id, sent, held, processed)
}

// A patrol drive whose look-up by reference took most of its lease registers the Unknown session
// again, and its replica dies with the registration on the wire. The lease ran out one gateway
// timeout after the send, and the next replica looked up (nothing yet) and registered beside it.
// A drive's lease is held RegisterGrace past a registration it sends. Negative control (run by
// hand): the lease as claimed, two payments.
func TestALateDrivesRegistrationIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-late-drive", 1000).ID
	b.clock.Advance(5 * time.Minute) // due for the patrol

	a := b.service(b.pool, "replica-dies")
	find := b.gw.Hold(fakegw.OpFind)
	reg := b.gw.Hold(fakegw.OpRegister)
	leased := b.clock.Now()
	aDone := make(chan struct{})
	go func() { defer close(aDone); _, _ = a.SweepOnce(ctx) }()
	mustWait(t, find.Arrived(), "A's look-up by reference")
	b.gw.Unhold(fakegw.OpFind)
	b.clock.Advance(45 * time.Second) // the look-up took most of the drive's budget
	find.Open()
	mustWait(t, reg.Arrived(), "A's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	sent := b.clock.Now()
	// A's replica is gone with its registration on the wire. Replica B's rounds come after A's
	// lease (LeaseFor) ran out.
	b.clock.Set(leased.Add(payments.LeaseFor(0) + time.Second))
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	reg.Open() // the gateway finishes A's request
	mustWait(t, aDone, "A's round")
	if pays := b.gw.PaymentsWithReference(id); pays != 1 {
		t.Fatalf("%d register calls, %d gateway payments: replica B registered again %s after A's send, inside RegisterGrace (%s)",
			b.gw.KeyCalls(fakegw.OpRegister, id), pays, b.clock.Now().Sub(sent), payments.StaleAfterFor(0))
	}
}

// A confirmed cancel of an Unknown payment with no gateway id: the confirm's own drive looks it
// up by reference (nothing there), and that took 19 s before it registered under the session's
// key to have something to reverse; its replica dies with the registration on the wire. The
// cancel's first look by the patrol was due RegisterGrace after the commit, 11 s after the send,
// and the patrol registered again beside it. Negative control (run by hand): without the hold
// before the send, two payments.
func TestALateCancelDrivesRegistrationIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-late-cancel-drive", 1000).ID
	b.clock.Advance(time.Minute) // the registration's 5xx is long over
	ch, err := b.svc.RequestCancel(ctx, api, id)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, id)

	a := b.service(b.pool, "replica-dies")
	find := b.gw.Hold(fakegw.OpFind)
	reg := b.gw.Hold(fakegw.OpRegister)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = a.ConfirmCancel(ctx, api, id, ch.ID, code)
	}()
	mustWait(t, find.Arrived(), "the confirm's look-up by reference")
	b.gw.Unhold(fakegw.OpFind)
	b.clock.Advance(19 * time.Second) // a slow look-up
	find.Open()
	mustWait(t, reg.Arrived(), "the confirm's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	sent := b.clock.Now()
	b.clock.Set(sent.Add(payments.StaleAfterFor(0) - time.Second))
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	reg.Open() // the gateway finishes the request of the replica that died
	mustWait(t, done, "the confirm")
	if pays := b.gw.PaymentsWithReference(id); pays != 1 {
		t.Fatalf("%d register calls, %d gateway payments: the patrol registered again %s after the cancel's send, inside RegisterGrace",
			b.gw.KeyCalls(fakegw.OpRegister, id), pays, b.clock.Now().Sub(sent))
	}
}

// A late Create's hold waited 9 s for the order's row (another transaction of the order: a
// confirm, an approval, a check's apply) and was timed from before the wait: the registration
// went out at claim+24 s, held only until claim+45 s, and the patrol registered beside it (a
// review of holdForSend). The hold runs from the time read once the row is locked. Negative
// control (run by hand): until read before the lock, two payments.
func TestALateCreatesHoldRunsFromAfterItsLockWait(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	b.gw.IgnoreKeys(true)
	ctx := context.Background()
	var blocker pgx.Tx
	a := b.service(b.pool, "replica-dies", func(c *payments.Config) {
		c.Hooks.BeforeRegister = func(_ context.Context, id string) {
			b.clock.Advance(15 * time.Second) // the claim answered late
			var err error
			if blocker, err = b.pool.Begin(ctx); err != nil {
				t.Error(err)
				return
			}
			// another transaction of the order holds its row (as every apply does)
			if _, err := blocker.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = 'o-late-hold-lock-wait' FOR UPDATE`); err != nil {
				t.Error(err)
			}
		}
	})
	held := b.gw.Hold(fakegw.OpRegister)
	done := make(chan error, 1)
	go func() {
		_, err := a.Create(ctx, api, payments.CreateInput{OrderID: "o-late-hold-lock-wait", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
		done <- err
	}()
	waitLockWaiters(t, b.pool, 1) // the Create's hold waits for the order's row
	b.clock.Advance(9 * time.Second)
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	id := mustWait(t, held.Arrived(), "the Create's registration at the gateway")
	sent := b.clock.Now()
	b.gw.Unhold(fakegw.OpRegister)
	processed := make(chan struct{})
	go func() { <-done; close(processed) }()
	b.wantNoRegistrationBeside(t, id, sent, held, processed)
}

// A late Create's hold (its claim answered 15 s late, still inside the window in which it may
// send) waited for the order's row past the claim's RegisterGrace; meanwhile the patrol claimed
// the session, looked it up (nothing) and registered it under its lease. The hold then took the
// row and the Create sent its registration beside the patrol's: two payments at a gateway that
// ignores keys (a review of the lease edge). The hold sends only while the session is still the
// Create's alone (holdLateSend). Negative control (run by hand): holdForSend's hold, two payments.
func TestALateCreatesHoldPastItsGraceLeavesTheSessionToThePatrol(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	b.gw.IgnoreKeys(true)
	ctx := context.Background()
	const order = "o-late-hold-past-grace"
	var blocker pgx.Tx
	a := b.service(b.pool, "replica-create", func(c *payments.Config) {
		c.Hooks.BeforeRegister = func(_ context.Context, id string) {
			b.clock.Advance(15 * time.Second) // the claim answered late, still inside sendFitsGrace
			var err error
			if blocker, err = b.pool.Begin(ctx); err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() { _ = blocker.Rollback(context.Background()) }) // before the pool closes, should the test fail
			if _, err := blocker.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = $1 FOR UPDATE`, order); err != nil {
				t.Error(err)
			}
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := a.Create(ctx, api, payments.CreateInput{OrderID: order, Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
		done <- err
	}()
	waitLockWaiters(t, b.pool, 1) // the Create's hold waits for the order's row
	// The wait outlasts the claim's grace (claim + 35 s > claim + RegisterGrace = 30 s).
	b.clock.Advance(20 * time.Second)
	patrols := b.gw.Hold(fakegw.OpRegister)
	swept := make(chan error, 1)
	go func() { _, err := b.svc.SweepOnce(ctx); swept <- err }()
	mustWait(t, patrols.Arrived(), "the patrol's registration")
	b.gw.Unhold(fakegw.OpRegister)
	patrols.Open()
	// The patrol's drive registered and now waits for the order's row to apply its answer.
	waitLockWaiters(t, b.pool, 2)
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("setup: %d register calls before the blocker ends, want the patrol's 1", n)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mustWait(t, done, "the Create"); err != nil {
		t.Logf("create: %v", err)
	}
	if err := mustWait(t, swept, "the patrol"); err != nil {
		t.Logf("sweep: %v", err)
	}
	var id string
	if err := b.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE order_id = $1`, order).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if regs, pays := b.gw.KeyCalls(fakegw.OpRegister, id), b.gw.PaymentsWithReference(id); regs != 1 || pays != 1 {
		t.Errorf("%d register calls, %d gateway payments for one session: the Create sent its registration after its hold found the grace over and the patrol registering (cases: %v)",
			regs, pays, b.openCaseKinds(t, id))
	}
}
