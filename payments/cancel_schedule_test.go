package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// sessionSchedule reads the patrol's columns of one session.
func (b *bench) sessionSchedule(t *testing.T, id string) (status string, attempts int, flagged bool, next *time.Time) {
	t.Helper()
	if err := b.pool.QueryRow(context.Background(), `SELECT status, check_attempts, flagged_at IS NOT NULL, next_check_at
		FROM payment_sessions WHERE id = $1`, id).Scan(&status, &attempts, &flagged, &next); err != nil {
		t.Fatal(err)
	}
	return status, attempts, flagged, next
}

// A cancel confirmed for a payment the patrol had given up on (flagged when its schedule ran
// out) is the patrol's again: a reverse whose answer is lost is sent again, on a schedule that
// starts from its first step. The flag stayed: the patrol, which claims no flagged row, never
// sent the reverse again and the payment stayed Canceling for good; and the cancel inherited the
// check's spent attempts, so even unflagged its first look would have flagged it (outside review).
func TestCancelOfAFlaggedPaymentIsSentAgainByThePatrol(t *testing.T) {
	t.Parallel()
	steps := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
	b := newBench(t, func(c *payments.Config) { c.Backoff = steps })
	ctx := context.Background()
	sess := b.registered(t, "o-flagged-cancel", 1000)
	for range 4 {
		b.clock.Advance(5 * time.Second)
		if _, err := b.svc.SweepOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, attempts, flagged, _ := b.sessionSchedule(t, sess.ID); !flagged || attempts != len(steps) {
		t.Fatalf("before the cancel: flagged=%v after %d looks, want flagged after %d", flagged, attempts, len(steps))
	}

	b.cancelWithLostReverse(t, sess)
	b.gw.Fail(fakegw.OpReverse, fakegw.Transient, 1) // the patrol's first reverse is lost too
	status, attempts, flagged, _ := b.sessionSchedule(t, sess.ID)
	if status != "Canceling" || flagged || attempts != 0 {
		t.Fatalf("after the confirm: %s flagged=%v attempts=%d, want Canceling, unflagged, a new schedule", status, flagged, attempts)
	}
	if n := b.count(t, `SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status = 'Canceling' AND reason LIKE '%flag cleared (%'`, sess.ID); n != 1 {
		t.Fatalf("timeline events naming the cleared flag = %d, want 1", n)
	}

	b.clock.Advance(time.Hour) // past the confirm's grace
	if n, err := b.svc.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("first patrol round drove %d (%v), want the Canceling payment", n, err)
	}
	status, attempts, flagged, next := b.sessionSchedule(t, sess.ID)
	if status != "Canceling" || flagged || attempts != 1 || next == nil || !next.Equal(b.clock.Now().Add(steps[1])) {
		t.Fatalf("after a lost reverse: %s flagged=%v attempts=%d next=%v, want Canceling due at the schedule's second step", status, flagged, attempts, next)
	}
	b.clock.Advance(steps[1])
	if n, err := b.svc.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("second patrol round drove %d (%v)", n, err)
	}
	if final, _ := b.svc.Get(ctx, sess.ID); final.Status != payments.StatusCanceled {
		t.Fatalf("after the patrol = %s, want Canceled", final.Status)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 3 {
		t.Fatalf("gateway reverses = %d, want 3 (confirm, two patrol looks)", n)
	}
}

// A cancel confirmed while another replica's patrol drive has the payment leased: the drive's
// release records its look with the next step of the schedule, and it set next_check_at to that
// over the confirm's grace (its first look waits until the confirm's own reverse can no longer
// be in flight). A third replica's patrol then claimed the payment within the grace and sent
// the same reverse beside the confirm's (outside review).
func TestReleaseKeepsAConfirmedCancelsGrace(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	patrol := b.service(testdb.Pool(t, b.url), "replica-b")
	third := b.service(testdb.Pool(t, b.url), "replica-c")
	ctx := context.Background()
	sess := b.registered(t, "o-cancel-under-a-drive", 1000)

	gate := b.gw.Hold(fakegw.OpStatus)
	b.clock.Advance(payments.DefaultBackoff[0] + time.Second)
	swept := make(chan error, 1)
	go func() {
		_, err := patrol.SweepOnce(ctx)
		swept <- err
	}()
	<-gate.Arrived() // the patrol's drive holds the lease and waits for the gateway's status

	b.gw.Unhold(fakegw.OpStatus)
	confirmedAt := b.clock.Now()
	b.cancelWithLostReverse(t, sess)
	gate.Open()
	if err := <-swept; err != nil {
		t.Fatal(err)
	}
	status, _, _, next := b.sessionSchedule(t, sess.ID)
	grace := max(payments.DefaultBackoff[0], payments.StaleAfterFor(0))
	if status != "Canceling" || next == nil || next.Before(confirmedAt.Add(grace)) {
		t.Fatalf("after the drive's release: %s due %v, want Canceling due no sooner than %v (the confirm's grace)", status, next, confirmedAt.Add(grace))
	}
	b.clock.Advance(grace - time.Second)
	if n, err := third.SweepOnce(ctx); err != nil || n != 0 {
		t.Fatalf("a third replica's patrol drove %d (%v) within the confirm's grace", n, err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("gateway reverses = %d, want the confirm's one", n)
	}
}
