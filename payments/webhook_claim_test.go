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

// A second contradiction of a payment was dropped while a case of the same kind was open: the
// gateway first answered a wrong amount (flag, gateway_mismatch case), then the right amount
// captured (Completed, order Paid), then reversed. "Gateway says reversed for a Completed
// session" went through openCase (ON CONFLICT DO NOTHING), so the open case still spoke only of
// the amount; once finance closed it, nothing said the money had gone back (a webhook answered
// 200 is not sent again; the patrol drives no Completed session). From an outside review
// (gateway edges); negative control: with openCase in applyLocked, no open case mentions the
// reversal.
func TestASecondContradictionIsAddedToTheOpenCase(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-two-contradictions", 9900)
	b.gw.SetAmount(s.GatewayPaymentID, 100, "EUR")
	if _, err := b.svc.Check(ctx, api, s.ID); err != nil {
		t.Fatal(err)
	}
	b.gw.SetAmount(s.GatewayPaymentID, 9900, "EUR")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	got, err := b.svc.Check(ctx, api, s.ID)
	if err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("setup: %s %v", got.Status, err)
	}
	// The gateway now says the captured payment was reversed (a webhook's hint).
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayReversed)
	if _, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-reversed", Type: "payment.updated", PaymentID: s.GatewayPaymentID, Reference: s.ID}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL AND detail LIKE '%reversed%'`, s.ID); n != 1 {
		var detail string
		_ = b.pool.QueryRow(ctx, `SELECT string_agg(kind || ': ' || detail, ' | ') FROM finance_cases WHERE session_id = $1`, s.ID).Scan(&detail)
		t.Errorf("the gateway reversed a Completed (Paid) payment and %d open finance cases say so; cases: %s", n, detail)
	}
	// The same answer again adds nothing.
	if _, err := b.svc.Check(ctx, api, s.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT (length(detail) - length(replace(detail, 'reversed', ''))) / length('reversed') FROM finance_cases
		WHERE session_id = $1 AND resolved_at IS NULL AND kind = 'gateway_mismatch'`, s.ID); n != 1 {
		t.Errorf("the reversal is written %d times in the open case, want once", n)
	}
}
