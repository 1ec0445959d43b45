package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A webhook delivery whose apply is slow (the gateway's status read takes its time) keeps its
// claim on the event for as long as the work may take: the patrol's retry does not take the
// event over and apply it a second time beside the delivery. The claim was RegisterGrace
// (2 × GATEWAY_TIMEOUT + 10 s) while the work under it (a status read, a lock wait, a stale
// answer asked again) can take longer; it is the patrol's lease now, as for every other source.
func TestSlowWebhookDeliveryKeepsItsEvent(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	sess := b.registered(t, "o-slow-event", 500)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)

	gate := b.gw.Hold(fakegw.OpStatus)
	delivered := make(chan error, 1)
	go func() {
		_, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-slow", Type: "payment.updated",
			PaymentID: sess.GatewayPaymentID, Reference: sess.Reference()})
		delivered <- err
	}()
	mustWait(t, gate.Arrived(), "the delivery's status read")
	calls := b.gw.Calls(fakegw.OpStatus)
	// The delivery is still at the gateway past the old claim; the patrol looks for events.
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	b.gw.Unhold(fakegw.OpStatus) // a retry's read would not wait at the gate
	n, err := b.plain.RetryWebhooksOnce(ctx)
	if err != nil || n != 0 {
		t.Errorf("the patrol applied %d events (%v) whose delivery was still at work", n, err)
	}
	gate.Open()
	if err := mustWait(t, delivered, "the delivery"); err != nil {
		t.Fatal(err)
	}
	if extra := b.gw.Calls(fakegw.OpStatus) - calls; extra != 0 {
		t.Errorf("%d more status reads beside the delivery's", extra)
	}
	if got, _ := b.svc.Get(ctx, sess.ID); got.Status != payments.StatusCompleted {
		t.Fatalf("status %s after the delivery", got.Status)
	}
}
