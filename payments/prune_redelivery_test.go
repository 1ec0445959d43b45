package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// A webhook naming a second payment under a session's reference that the gateway does not know
// opens a duplicate case; finance resolves it. The gateway's retries run for days, and once
// `pitlane prune --webhook-events` (a day at the least) removed the event's inbox row, the same
// event redelivered opened the case again: it had no fact to be known as resolved news by (a
// review of retention; docs/operations.md promises such a redelivery is harmless). Its fact is
// the missing payment now. Negative control (run by hand): without the fact, one open case after
// the prune.
func TestARedeliveryAfterPruneDoesNotReopenAResolvedCase(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-prune-redelivery", 700)
	ev := payments.GatewayEvent{ID: "evt_phantom_1", Type: "payment.updated", PaymentID: "gp_phantom", Reference: s.ID}
	open := func() int {
		return b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL`,
			s.ID, payments.CaseDuplicatePayment)
	}
	if _, err := b.svc.HandleGatewayEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if open() != 1 {
		t.Fatalf("setup: the unknown second payment opened %d cases", open())
	}
	b.resolveOpenCase(t, s.ID, payments.CaseDuplicatePayment, "checked at the gateway: no such payment, nothing taken")
	b.clock.Advance(2 * 24 * time.Hour)
	if _, err := b.svc.Prune(ctx, payments.PruneConfig{WebhookEvents: payments.MinPruneAge, Actor: "cli:test"}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM webhook_events`); n != 0 {
		t.Fatalf("setup: %d inbox rows left after the prune", n)
	}
	res, err := b.svc.HandleGatewayEvent(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if n := open(); n != 0 {
		t.Fatalf("the same event redelivered after the prune (%s) reopened the case finance resolved: %d open", res.Outcome, n)
	}
}
