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

// A cancel confirmed while the patrol's drive holds the payment (a check in flight) keeps the
// reverse's whole schedule: the confirm takes the lease from the drive, whose release then finds
// nothing to count. The release counted the check's look against the reverse's fresh schedule
// (attempts 1 right after the confirm), so a reverse that kept finding no answer was sent once
// fewer (the last, longest step) and reached finance a day early (cross-operation review,
// session 30). Negative control: without the lease columns cleared in ConfirmCancel, the patrol
// sends the reverse 2 times before the flag, not 3.
func TestACancelConfirmedUnderADriveKeepsItsWholeSchedule(t *testing.T) {
	t.Parallel()
	steps := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
	b := newBench(t, func(c *payments.Config) { c.Backoff = steps; c.RegisterGrace = time.Second })
	ctx := context.Background()
	sess := b.registered(t, "o-cancel-under-drive-schedule", 1000)

	gate := b.gw.Hold(fakegw.OpStatus)
	b.clock.Advance(payments.DefaultBackoff[0] + time.Second)
	swept := make(chan error, 1)
	go func() { _, err := b.svc.SweepOnce(ctx); swept <- err }()
	mustWait(t, gate.Arrived(), "the patrol's status call") // the drive holds the lease
	b.gw.Unhold(fakegw.OpStatus)
	b.cancelWithLostReverse(t, sess) // Canceling, attempts 0, the confirm's own reverse lost
	gate.Open()
	if err := mustWait(t, swept, "the patrol"); err != nil {
		t.Fatal(err)
	}
	if status, attempts, flagged, _ := b.sessionSchedule(t, sess.ID); status != "Canceling" || attempts != 0 || flagged {
		t.Fatalf("after the drive: %s attempts=%d flagged=%v, want Canceling with the reverse's schedule untouched", status, attempts, flagged)
	}

	// The gateway keeps losing the reverse's answer: the patrol sends it once per step.
	b.gw.Fail(fakegw.OpReverse, fakegw.Transient, 100)
	before := b.gw.Calls(fakegw.OpReverse)
	for range 10 {
		b.clock.Advance(time.Hour)
		if _, err := b.svc.SweepOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, flagged, _ := b.sessionSchedule(t, sess.ID); flagged {
			break
		}
	}
	_, _, flagged, _ := b.sessionSchedule(t, sess.ID)
	if sends := b.gw.Calls(fakegw.OpReverse) - before; !flagged || sends != len(steps) {
		t.Fatalf("the patrol sent the reverse %d times before flagging it (flagged=%v), want %d: a fresh cancel's schedule", sends, flagged, len(steps))
	}
}

// Three at once on one payment (cross-operation review, session 30; it held): the patrol's drive
// parked with an "authorized" answer, a staff cancel committed (Canceling) and parked before its
// reverse, and a webhook whose Check finds the customer's capture. One ledger entry, no reverse
// sent, the cancel refused (409), one cancel_lost_race case and no false case.
func TestPatrolCancelAndWebhookOnOnePayment(t *testing.T) {
	t.Parallel()
	patrolPark := newParker()
	b := newBench(t, func(c *payments.Config) {
		c.Hooks.AfterGatewayStatus = func(ctx context.Context, id string, _ payments.GatewayPayment) { patrolPark.hook(ctx, id) }
	})
	cancelPark := newParker()
	staff := b.service(b.pool, "replica-b", func(c *payments.Config) { c.Hooks.AfterCancelCommit = cancelPark.hook })
	hook := b.service(b.pool, "replica-c")
	ctx := context.Background()
	sess := b.registered(t, "o-patrol-cancel-webhook", 700)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewayAuthorized)

	b.clock.Advance(10 * time.Second)
	swept := make(chan error, 1)
	go func() { _, err := b.svc.SweepOnce(ctx); swept <- err }()
	mustWait(t, patrolPark.arrived, "the patrol's answer")

	ch, err := staff.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	type res struct {
		r   payments.ConfirmResult
		err error
	}
	confirmed := make(chan res, 1)
	go func() { r, err := staff.ConfirmCancel(ctx, api, sess.ID, ch.ID, code); confirmed <- res{r, err} }()
	mustWait(t, cancelPark.arrived, "the cancel's commit")

	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := hook.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "ev-triple-1", Type: "payment.updated", PaymentID: sess.GatewayPaymentID, Reference: sess.ID}); err != nil {
		t.Fatal(err)
	}
	cancelPark.let(1)
	c := mustWait(t, confirmed, "the cancel")
	patrolPark.let(1)
	if err := mustWait(t, swept, "the patrol"); err != nil {
		t.Fatal(err)
	}
	if payments.ErrorCode(c.err) != payments.ECONFLICT {
		t.Errorf("confirm cancel = %s %v, want a 409 (the capture won)", c.r.Session.Status, c.err)
	}
	got, _ := b.plain.Get(ctx, sess.ID)
	if got.Status != payments.StatusCompleted {
		t.Errorf("status = %s, want Completed", got.Status)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 0 {
		t.Errorf("reverses sent = %d, want 0", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, sess.ID); n != 1 {
		t.Errorf("ledger entries = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'cancel_lost_race'`, sess.ID); n != 1 {
		t.Errorf("cancel_lost_race cases = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind <> 'cancel_lost_race'`, sess.ID); n != 0 {
		t.Errorf("other cases = %d, want 0", n)
	}
	if n := b.count(t, `SELECT count(*) FROM reverse_operations WHERE session_id = $1 AND status = 'Refused'`, sess.ID); n != 1 {
		t.Errorf("refused reverse ops = %d, want 1", n)
	}
	checkInvariants(t, b)
}
