package handlers_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"pitlane/payments"
)

// Two identical keyless refunds arrive together: the first (holding the intent) is refused 409 (a
// Pending refund still holds the room), the patrol settles that Pending refund Failed, and the
// duplicate (which ran its effect under the first one's use, BusyRunsEffect) makes refund R. The
// first request's Release deleted the intent row (it never saw R), so an identical keyless retry
// 10 s later — well within 5 minutes of the previous one — was a new use of the intent and
// refunded the same amount a second time (an outside review). The contract: "a keyless refund
// repeating the same amount for the same payment within 5 minutes of the previous one is the
// same refund". The interleaving is forced: A parked inside its claim (AfterRefundLock), the
// patrol's apply and then the duplicate seen queued for the order's row lock, which PostgreSQL
// grants in arrival order. Negative control: releasing intents on a refusal (idempotency.go's
// giveUp) refunds 1000.
func TestKeylessRefundAfterABusyDuplicateIsTheSameRefund(t *testing.T) {
	t.Parallel()
	p := newParker()
	var parked atomic.Bool
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) {
		c.Hooks.AfterRefundLock = func(ctx context.Context, id string) {
			if parked.CompareAndSwap(false, true) {
				p.hook(ctx, id)
			}
		}
	}})
	pay := b.completedPayment(t, "o-busy-refund", 1000)

	// A refund of 700 that the gateway holds as pending: 202, it keeps 700 of the room.
	b.gw.SetRefundOutcome("pending")
	parked.Store(true) // do not park the setup's refund
	p1 := wantRefund(t, b.do(post(refundsPath(pay.ID), `{"amount":700}`, "Idempotency-Key", "p1")), http.StatusAccepted)
	parked.Store(false)
	b.gw.SetRefundOutcome("succeeded")
	b.gw.SetRefundStatus(*pay.GatewayPaymentID, "failed") // the gateway will say P1 failed
	b.clock.Advance(time.Minute)                          // P1 is due for the patrol

	keyless := post(refundsPath(pay.ID), `{"amount":500}`)
	a := b.goDo(b.e, keyless) // holds the intent; parked inside its claim (locks held)
	mustWait(t, p.arrived, "A inside its claim")

	patrol := make(chan error, 1)
	go func() { _, err := b.svc.DriveRefunds(context.Background()); patrol <- err }()
	// The patrol's apply waits for the payment's locks. (First its call's log row waits for the
	// session's row, which A's claim holds, for the bench's lock_timeout, 10 s, and is dropped:
	// writeCallLog's bounded wait. A shorter timeout would risk the apply's own wait here.)
	waitOrderWaiters(t, b, 1)

	dup := b.goDo(b.e, keyless) // busy intent → runs the effect under A's use
	waitOrderWaiters(t, b, 2)   // … and waits behind the patrol

	p.release <- struct{}{}
	recA := mustWait(t, a, "A")
	if err := mustWait(t, patrol, "patrol"); err != nil {
		t.Fatal(err)
	}
	recB := mustWait(t, dup, "duplicate")
	if recA.Code != http.StatusConflict || recB.Code != http.StatusCreated {
		t.Fatalf("the interleaving was not reached: A %d, the duplicate %d", recA.Code, recB.Code)
	}
	r1 := wantRefund(t, recB, http.StatusCreated)
	if r, _ := b.svc.GetRefund(context.Background(), p1.ID); r.Status != "Failed" {
		t.Fatalf("P1 = %s", r.Status)
	}

	b.clock.Advance(10 * time.Second)
	if r := wantRefund(t, b.do(keyless), http.StatusCreated); r.ID != r1.ID {
		t.Errorf("identical keyless refund 10 s after refund %s made a second refund %s (status %s)", r1.ID, r.ID, r.Status)
	}
	if n := b.count(t, `SELECT coalesce(sum(amount),0)::int FROM refunds WHERE status = 'Succeeded'`); n != 500 {
		t.Errorf("refunded (Succeeded) = %d, want 500 (one refund of the keyless intent)", n)
	}
	if n := b.gw.Refunds(*pay.GatewayPaymentID); n != 2 {
		t.Errorf("the gateway made %d refunds, want 2 (P1 and the keyless one)", n)
	}
}

func waitOrderWaiters(t *testing.T, b *apiBench, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var waiting int
		if err := b.pool.QueryRow(context.Background(), `SELECT count(DISTINCT a.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE NOT l.granted AND a.datname = current_database() AND a.query LIKE 'SELECT status FROM orders%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
	}
	t.Fatalf("never saw %d order-lock waiters", n)
}
