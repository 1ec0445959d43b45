package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// A gateway that ignored our key made a second payment B under session S's reference, both
// pending. The customer paid A (S Completed); reconciliation reported the duplicate, and
// finance, reading "B pending, nothing taken", resolved it. Then the customer paid B too, from a
// second tab on B's page: a second charge. The case's fact named the payments' ids only, so B's
// capture — found by the next reconciliation, or told by B's webhook — was "a contradiction
// finance resolved" and opened nothing: the second charge never reached finance. Each finder
// now opens a case (the facts carry each payment's status; the webhook's event is news itself),
// and a reconciliation of the same payments, unchanged, still opens none. From an outside
// review; negative control: paymentFacts with the ids alone fails "reconciliation", the
// webhook's case with the two ids as facts fails "webhook".
func TestADuplicateChargedAfterItsCaseWasResolvedReachesFinance(t *testing.T) {
	t.Parallel()
	for _, finder := range []string{"reconciliation", "webhook"} {
		t.Run(finder, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx := context.Background()
			s := b.registered(t, "o-dup-later-"+finder, 700)
			second := b.secondPayment(t, s)
			b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
			if got, err := b.plain.Check(ctx, api, s.ID); err != nil || got.Status != payments.StatusCompleted {
				t.Fatalf("setup: %s %v", got.Status, err)
			}
			b.clock.Advance(time.Minute)
			reconcile(t, b.svc, payments.ReconcileConfig{})
			b.resolveOpenCase(t, s.ID, payments.CaseDuplicatePayment, "B is pending at the gateway: nothing taken, it expires by itself")
			open := func() int {
				return b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = $2 AND resolved_at IS NULL`,
					s.ID, payments.CaseDuplicatePayment)
			}
			b.clock.Advance(time.Minute)
			if reconcile(t, b.svc, payments.ReconcileConfig{}); open() != 0 {
				t.Fatal("reconciliation of the same payments, unchanged, opened the resolved duplicate again")
			}

			b.gw.SetStatus(second.ID, payments.GatewaySucceeded) // the second charge
			b.clock.Advance(time.Minute)
			switch finder {
			case "reconciliation":
				reconcile(t, b.svc, payments.ReconcileConfig{})
			case "webhook":
				if _, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_b_succeeded", Type: "payment.updated",
					PaymentID: second.ID, Reference: s.ID}); err != nil {
					t.Fatal(err)
				}
			}
			if open() != 1 {
				t.Errorf("gateway payment %s was captured after finance resolved its duplicate as pending, and no open case says so", second.ID)
			}
		})
	}
}
