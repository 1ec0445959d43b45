package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The request that claimed a refund sends it late (its claim answered 15 s late: still inside
// sendFitsGrace), and its replica dies with the refund on the wire (modeled, as in
// TestALateRefundDrivesSendIsNotSentAgainBesideIt, by holding the call): the refund was due at
// its claim's grace, and the patrol sent it again inside the send's: two refunds at a gateway
// that does not honour the key (a review of 32edbf9). A late first send holds the refund first
// (holdLateRefundSend), as a late Create holds its session. Negative control (run by hand):
// without the hold, two refunds.
func TestALateFirstRefundSendIsHeldBeforeItGoes(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-late-first-refund", 1000)
	claimedAt := b.clock.Now()
	a := lateRefundClaimer(b, "replica-dies", nil)
	b.gw.IgnoreKeys(true)
	send := b.gw.Hold(fakegw.OpRefund)
	done := make(chan error, 1)
	var res payments.RefundResult
	go func() {
		var err error
		res, err = a.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 1000, RequestKey: "k"})
		done <- err
	}()
	mustWait(t, send.Arrived(), "the API's refund at the gateway")
	b.gw.Unhold(fakegw.OpRefund)
	sent := b.clock.Now()
	// A's process is gone with the refund on the wire; the patrol looks once the claim's grace ran out.
	b.clock.Set(claimedAt.Add(payments.StaleAfterFor(0) + time.Second))
	if _, err := b.svc.DriveRefunds(ctx); err != nil {
		t.Fatal(err)
	}
	send.Open()
	if err := mustWait(t, done, "the API's request"); err != nil {
		t.Logf("CreateRefund: %v", err)
	}
	id := res.Refund.ID
	if n := b.gw.Refunds(s.GatewayPaymentID); n != 1 {
		ledger := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND session_id = $1`, s.ID)
		t.Fatalf("%d gateway refunds (%d refund calls for %s, %d RefundIssued rows): the patrol sent it again %s after the API's late send, inside RegisterGrace (%s)",
			n, b.gw.Calls(fakegw.OpRefund), id, ledger, b.clock.Now().Sub(sent), payments.StaleAfterFor(0))
	}
}

// A late first send's hold found the refund taken up by the patrol meanwhile (its hold waited
// past the claim's grace, for a connection: here the hook stands for the wait, the patrol's
// round running in it and its send failing): the request sends nothing beside the patrol's and
// answers the refund as it is now. The hold's guard — never leased nor looked at, no call logged
// — is what stops it (a re-read: holding unconditionally, every refund test passed). Negative
// control (run by hand): the guard reduced to the row's id, two refund requests.
func TestALateFirstRefundSendLeavesARefundThePatrolTookUp(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-late-refund-patrol-took", 1000)
	claimed := b.clock.Now()
	a := lateRefundClaimer(b, "replica-late", func() {
		// The hold's wait outlasts the claim's grace: the patrol's round takes the refund up and
		// sends it; the gateway answers 503.
		b.clock.Set(claimed.Add(payments.StaleAfterFor(0) + time.Second))
		b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1)
		if _, err := b.svc.DriveRefunds(ctx); err != nil {
			t.Error(err)
		}
	})
	res, err := a.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 1000, RequestKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.gw.KeyCalls(fakegw.OpRefund, res.Refund.ID); n != 1 || res.Refund.Status != payments.RefundPending {
		t.Fatalf("%d refund requests, the refund %s: the late request sent beside the patrol's (want the patrol's one, Pending)", n, res.Refund.Status)
	}
}

// onTheWireRefund is the fake gateway that goes on with a refund request it has received when
// its caller hangs up (a replica stopped with the call on the wire): the caller hears nothing.
type onTheWireRefund struct {
	*fakegw.Gateway
	processed chan struct{}
}

func (g *onTheWireRefund) Refund(ctx context.Context, id, key string, amount int64, currency string) (payments.GatewayRefund, error) {
	type answer struct {
		gr  payments.GatewayRefund
		err error
	}
	got := make(chan answer, 1)
	go func() {
		defer close(g.processed)
		gr, err := g.Gateway.Refund(context.WithoutCancel(ctx), id, key, amount, currency)
		got <- answer{gr, err}
	}()
	select {
	case a := <-got:
		return a.gr, a.err
	case <-ctx.Done():
		return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureUnknown, Op: fakegw.OpRefund, Err: ctx.Err()}
	}
}

// A late first send's hold waited past the claim's grace (the hook stands for the wait). A
// replica's patrol meanwhile took the refund up and sent it, and was stopped with the refund on
// the wire; the call's log row could not be written (another transaction held the session's row
// past lock_timeout, and the log row's foreign key waits for it), and the stop gave the lease
// back with no look counted. The hold's guard found the refund as untouched as a refund nobody
// had sent, and the request sent it beside the drive's: two refunds at a gateway that ignores
// keys (a review of stops). The drive's hold before its send leaves a mark the guard reads
// (send_held_at, written before the send). Negative controls: without the lock, the log row is
// written and the guard already held; without send_held_at in the guard (run by hand), two
// refunds.
func TestARefundCutOnTheWireWithItsCallLogLostIsNotSentAgainByALateHold(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-late-refund-cut-log-lost", 1000)
	claimed := b.clock.Now()
	b.gw.IgnoreKeys(true)
	gw := &onTheWireRefund{Gateway: b.gw, processed: make(chan struct{})}
	stopping := b.service(b.pool, "replica-stopping", func(c *payments.Config) {
		c.Gateway = gw
		c.LockTimeout = 300 * time.Millisecond
	})
	var held *fakegw.Gate
	a := lateRefundClaimer(b, "replica-late", func() {
		b.clock.Set(claimed.Add(payments.StaleAfterFor(0) + time.Second))
		held = b.gw.Hold(fakegw.OpRefund)
		round, stop := context.WithCancel(ctx)
		over := make(chan struct{})
		go func() { defer close(over); _, _ = stopping.DriveRefunds(round) }()
		mustWait(t, held.Arrived(), "the patrol's refund at the gateway")
		b.gw.Unhold(fakegw.OpRefund)
		blocker, err := b.pool.Begin(ctx)
		if err != nil {
			stop()
			t.Error(err)
			return
		}
		defer func() { _ = blocker.Rollback(ctx) }()
		if _, err := blocker.Exec(ctx, `SELECT FROM payment_sessions WHERE id = $1 FOR UPDATE`, s.ID); err != nil {
			t.Error(err)
		}
		stop() // SIGTERM: the drive is cut at its refund call
		mustWait(t, over, "the stopped round")
		if n := b.count(t, `SELECT count(*) FROM gateway_calls WHERE operation = 'refund'`); n != 0 {
			t.Errorf("the cut call's log row was written (%d): the probe no longer loses it", n)
		}
	})
	res, err := a.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 1000, RequestKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if held == nil {
		t.Fatal("the request's first send was not late: the hold never ran")
	}
	held.Open() // the gateway finishes the cut request
	mustWait(t, gw.processed, "the cut refund processed")
	if n := b.gw.Refunds(s.GatewayPaymentID); n != 1 {
		t.Fatalf("%d refunds at the gateway (%d requests for %s): the late request sent beside the patrol's cut send",
			n, b.gw.KeyCalls(fakegw.OpRefund, res.Refund.ID), res.Refund.ID)
	}
}

// lateRefundClaimer is a replica whose refund claims answer late (15 s: still inside
// sendFitsGrace), so their first send is a late one; beforeHold, when set, runs where the late
// send's hold starts (the BeforeLateHold hook).
func lateRefundClaimer(b *bench, replica string, beforeHold func()) *payments.Service {
	late := false
	return b.service(b.pool, replica, func(c *payments.Config) {
		c.Hooks.AfterRefundLock = func(context.Context, string) {
			if !late {
				late = true
				b.clock.Advance(15 * time.Second)
			}
		}
		if beforeHold != nil {
			c.Hooks.BeforeLateHold = func(context.Context, string) { beforeHold() }
		}
	})
}
