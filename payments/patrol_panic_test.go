package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// panicky is a gateway whose answer for one payment the code does not survive.
type panicky struct {
	payments.Gateway
	id string
}

func (g panicky) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	if id == g.id {
		panic("an answer nobody expected")
	}
	return g.Gateway.Status(ctx, id)
}

// A drive that panics ends as a look, not the process: the round goes on (the other payment is
// driven to Completed), and the poisoned payment's lease is given back with one look counted, so
// its backoff and, in the end, the flag for staff apply as to any payment that never settles.
// Before, the panic ended the replica, and every replica crash-looped on the same due payment.
func TestADriveThatPanicsIsALookNotACrash(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	poisoned := b.registered(t, "o-panic", 100)
	fine := b.registered(t, "o-panic-fine", 200)
	b.gw.SetStatus(fine.GatewayPaymentID, payments.GatewaySucceeded)
	svc := b.service(b.pool, "replica-p", func(c *payments.Config) {
		c.Gateway = panicky{Gateway: b.gw, id: poisoned.GatewayPaymentID}
	})
	b.clock.Advance(time.Hour)
	rep, err := svc.PatrolRound(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Driven != 2 {
		t.Fatalf("driven %d, want both payments", rep.Driven)
	}
	if got, err := b.svc.Get(t.Context(), fine.ID); err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("the other payment: %v %v, want Completed", got.Status, err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE id = $1 AND lease_token IS NULL
		AND check_attempts = 1 AND next_check_at > $2`, poisoned.ID, b.clock.Now()); n != 1 {
		t.Fatal("the poisoned payment's lease was not given back with one look and its backoff")
	}
}
