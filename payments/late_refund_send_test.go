package payments_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The refund's TestALateDrivesRegistrationIsNotSentAgainBesideIt: a Pending refund with no
// gateway refund id, looked at after the gateway may have forgotten its key (KeyRetention): the
// drive's look-up by key took most of its lease, it sent the refund (its lease check: the token
// only) and its replica died with the request on the wire. Replica B claimed the refund when A's
// lease ran out, found nothing by key yet and sent it again: two refunds at a gateway that does
// not honour the key, one RefundIssued row (a review of late sends). The lease is held
// RegisterGrace past the send. Negative control (run by hand): the token check alone, two.
func TestALateRefundDrivesSendIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s, r := unsentRefund(t, b, "o-late-refund-drive")

	a := b.service(b.pool, "replica-dies")
	find := b.gw.Hold(fakegw.OpFindRefund)
	send := b.gw.Hold(fakegw.OpRefund)
	leased := b.clock.Now()
	aDone := make(chan struct{})
	go func() { defer close(aDone); _, _ = a.DriveRefunds(ctx) }()
	mustWait(t, find.Arrived(), "A's look-up by key")
	b.gw.Unhold(fakegw.OpFindRefund)
	b.clock.Advance(45 * time.Second) // the look-up took most of the drive's budget
	find.Open()
	mustWait(t, send.Arrived(), "A's refund at the gateway")
	b.gw.Unhold(fakegw.OpRefund)
	sent := b.clock.Now()
	// A's replica is gone with its refund on the wire; B's round comes after A's lease ran out.
	b.clock.Set(leased.Add(payments.LeaseFor(0) + time.Second))
	if _, err := b.svc.DriveRefunds(ctx); err != nil {
		t.Fatal(err)
	}
	send.Open() // the gateway finishes A's request
	mustWait(t, aDone, "A's round")
	ledger := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND refund_id = $1`, r.ID)
	if n := b.gw.Refunds(s.GatewayPaymentID); n != 1 {
		t.Fatalf("%d refund calls, %d gateway refunds of one Pending refund (%d RefundIssued rows): replica B sent it again %s after A's send, inside RegisterGrace (%s)",
			b.gw.KeyCalls(fakegw.OpRefund, r.ID), n, ledger, b.clock.Now().Sub(sent), payments.StaleAfterFor(0))
	}
}

// cutRefund is the fake gateway whose first refund request is still being processed when the
// caller's call gives up on it (a timeout): the gateway finishes it when the test opens the gate.
type cutRefund struct {
	*fakegw.Gateway
	cut       chan struct{}
	processed chan struct{}
}

func (g *cutRefund) Refund(ctx context.Context, id, key string, amount int64, currency string) (payments.GatewayRefund, error) {
	select {
	case <-g.cut:
		return g.Gateway.Refund(ctx, id, key, amount, currency)
	default:
		close(g.cut)
	}
	go func() {
		defer close(g.processed)
		_, _ = g.Gateway.Refund(context.Background(), id, key, amount, currency)
	}()
	return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureUnknown, Op: fakegw.OpRefund, Err: context.DeadlineExceeded}
}

// The refund's registerAgain hold: a Pending refund with no gateway refund id, driven after
// KeyRetention (the patrol down for a day): nothing found by key, the refund sent, the call timed
// out with the gateway still processing it. The release gave it the schedule's next step (10 s),
// and that look found nothing by key yet and sent it again (a review of late sends). A refund
// sent and not answered is held RegisterGrace past its send. Negative control (run by hand):
// without the hold, two refunds.
func TestARefundSentPastKeyRetentionAndCutIsNotSentAgainInsideItsGrace(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s, r := unsentRefund(t, b, "o-refund-cut")
	cut, send, sent := driveCutRefund(t, b, "replica-a2")
	var due time.Time
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(next_check_at, 'infinity') FROM refunds WHERE id = $1`, r.ID).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if due.Before(sent.Add(payments.StaleAfterFor(0))) {
		b.clock.Set(due)
		if _, err := b.svc.DriveRefunds(ctx); err != nil {
			t.Fatal(err)
		}
	}
	send.Open() // the gateway finishes the request the drive gave up on
	mustWait(t, cut.processed, "the cut refund processed")
	ledger := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND refund_id = $1`, r.ID)
	if n := b.gw.Refunds(s.GatewayPaymentID); n > 1 {
		t.Fatalf("due %s after a refund sent and cut: %d refund calls, %d gateway refunds (%d RefundIssued rows): sent again inside RegisterGrace (%s)",
			due.Sub(sent), b.gw.KeyCalls(fakegw.OpRefund, r.ID), n, ledger, payments.StaleAfterFor(0))
	}
}

// RetryFlagged's wait for a registration in flight, for refunds: a refund's last look on its
// schedule (past KeyRetention: nothing found by key, sent again) was cut with the gateway still
// processing it; the release flagged it, finance sent it back at once (RetryFlaggedRefund: due
// now), and the patrol's look found nothing by key yet and sent it again beside the first (a
// review of late sends). Retry makes it due once it can no longer be in flight (refundInFlight).
// The same with the call's log row lost (written after the call, it can be: a drive cut by a
// stop, the session's row locked past lock_timeout): the send held for it (send_held_at) is in
// flight all the same (a review of send_held_at).
// Negative controls (run by hand): due now, two refunds; "due now" in its audit line; without
// send_held_at in callInFlight, due now with the log row lost.
func TestARetriedRefundIsNotSentBesideItsLastSend(t *testing.T) {
	t.Parallel()
	for _, logLost := range []bool{false, true} {
		t.Run(map[bool]string{false: "logged", true: "its log row lost"}[logLost], func(t *testing.T) {
			t.Parallel()
			retriedRefundNotSentBeside(t, logLost)
		})
	}
}

func retriedRefundNotSentBeside(t *testing.T, logLost bool) {
	b := newBench(t)
	ctx := context.Background()
	s, r := unsentRefund(t, b, "o-refund-retry")
	// The schedule's last look is due (the looks before found nothing and asked nothing new).
	if _, err := b.pool.Exec(ctx, `UPDATE refunds SET check_attempts = $2, next_check_at = $3 WHERE id = $1`,
		r.ID, len(payments.DefaultBackoff)-1, b.clock.Now()); err != nil {
		t.Fatal(err)
	}
	cut, send, sent := driveCutRefund(t, b, "replica-a3")
	if logLost {
		b.exec(t, `DELETE FROM gateway_calls WHERE idempotency_key = $1 AND operation = 'refund'`, r.ID)
	}
	if logLost {
		b.exec(t, `DELETE FROM gateway_calls WHERE idempotency_key = $1 AND operation = 'refund'`, r.ID)
	}
	if got, _ := b.svc.GetRefund(ctx, r.ID); got.FlaggedAt == nil {
		t.Fatalf("setup: not flagged after the last look: %+v", got)
	}
	b.clock.Advance(5 * time.Second) // finance sees the case and retries it
	fin := payments.Staff{Email: "fin@example.com", Role: "finance"}
	if _, err := b.svc.RetryFlaggedRefund(ctx, fin, r.ID); err != nil {
		t.Fatal(err)
	}
	var due time.Time
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(next_check_at, 'infinity') FROM refunds WHERE id = $1`, r.ID).Scan(&due); err != nil {
		t.Fatal(err)
	}
	// Its audit line says when (it said "due now", a review of 32edbf9).
	var detail string
	if err := b.pool.QueryRow(ctx, `SELECT detail FROM audit_log WHERE action = $1 ORDER BY id DESC LIMIT 1`, payments.AuditRefundRetry).Scan(&detail); err != nil {
		t.Fatal(err)
	}
	if !due.After(b.clock.Now()) || strings.Contains(detail, "due now") || !strings.Contains(detail, due.UTC().Format(time.RFC3339)) {
		t.Errorf("retried due %s from now, audited %q", due.Sub(b.clock.Now()), detail)
	}
	if due.Before(sent.Add(payments.StaleAfterFor(0))) {
		if due.After(b.clock.Now()) {
			b.clock.Set(due)
		}
		if _, err := b.svc.DriveRefunds(ctx); err != nil {
			t.Fatal(err)
		}
	}
	send.Open()
	mustWait(t, cut.processed, "the cut refund processed")
	ledger := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND refund_id = $1`, r.ID)
	if n := b.gw.Refunds(s.GatewayPaymentID); n > 1 {
		t.Fatalf("retried due %s after a cut send: %d refund calls, %d gateway refunds (%d RefundIssued rows): sent again inside RegisterGrace (%s)",
			due.Sub(sent), b.gw.KeyCalls(fakegw.OpRefund, r.ID), n, ledger, payments.StaleAfterFor(0))
	}
}

// driveCutRefund runs a patrol round of replica whose refund request is cut (a timeout) while
// the gateway goes on processing it, held at send until the test opens it; sent is when.
func driveCutRefund(t *testing.T, b *bench, replica string) (cut *cutRefund, send *fakegw.Gate, sent time.Time) {
	t.Helper()
	cut = &cutRefund{Gateway: b.gw, cut: make(chan struct{}), processed: make(chan struct{})}
	a := b.service(b.pool, replica, func(c *payments.Config) { c.Gateway = cut })
	send = b.gw.Hold(fakegw.OpRefund)
	if _, err := a.DriveRefunds(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustWait(t, send.Arrived(), "the cut refund still at the gateway")
	b.gw.Unhold(fakegw.OpRefund)
	return cut, send, b.clock.Now()
}

// unsentRefund is a Completed payment and a Pending refund of it that the gateway never processed
// (no gateway refund id), 25 hours later: past the gateway's key retention (24 h), so the patrol
// looks it up by key before sending it, and a gateway that from then on ignores keys.
func unsentRefund(t *testing.T, b *bench, order string) (payments.Session, payments.Refund) {
	t.Helper()
	b.gw.SetKeyRetention(24 * time.Hour)
	s := b.completed(t, order, 1000)
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1)
	r, err := b.svc.CreateRefund(context.Background(), api, payments.RefundInput{PaymentID: s.ID, Amount: 1000, RequestKey: "k"})
	if err != nil || r.Refund.Status != payments.RefundPending || r.Refund.GatewayRefundID != "" {
		t.Fatalf("setup: refund = %+v %v", r, err)
	}
	b.clock.Advance(25 * time.Hour)
	b.gw.IgnoreKeys(true)
	return s, r.Refund
}
