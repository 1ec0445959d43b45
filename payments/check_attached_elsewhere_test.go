package payments_test

import (
	"context"
	"testing"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// heldElsewhere answers the search for ref with payment id (another session's), its reference
// rewritten to ref, and its read by id likewise: a gateway that mixed its references up.
type heldElsewhere struct {
	*fakegw.Gateway
	ref, id string
}

func (g *heldElsewhere) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	if ref == g.ref {
		gp, err := g.Gateway.Status(ctx, g.id)
		gp.Reference = ref
		return []payments.GatewayPayment{gp}, err
	}
	return g.Gateway.FindByReference(ctx, ref)
}

func (g *heldElsewhere) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	gp, err := g.Gateway.Status(ctx, id)
	if id == g.id {
		gp.Reference = g.ref
	}
	return gp, err
}

// A session without its gateway id, looked up by reference, answered with a payment another
// session holds already: the unique index refused the attach (no second PaymentReceived), but
// every look failed with the raw "duplicate key" error, no flag and no case, and the order sat in
// limbo until the schedule ran out days later (a review of answers about other things). The
// session is flagged with a gateway_mismatch case naming the holder, nothing attached. Negative
// control (run by hand): without flagAttachedElsewhere, the Check's error.
func TestALookUpAnsweredWithAPaymentAttachedElsewhereIsFlagged(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	a := b.completed(t, "o-attached-a", 1000)
	u := b.unregistered(t, "o-attached-b", 1000)
	svc := b.service(b.pool, "replica-attached", func(c *payments.Config) {
		c.Gateway = &heldElsewhere{Gateway: b.gw, ref: u.ID, id: a.GatewayPaymentID}
	})
	got, err := svc.Check(ctx, api, u.ID)
	if err != nil || got.GatewayPaymentID != "" || got.FlaggedAt == nil {
		t.Fatalf("check = %s %q flagged %v, %v; want it flagged, nothing attached", got.Status, got.GatewayPaymentID, got.FlaggedAt, err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'PaymentReceived'`); n != 1 {
		t.Fatalf("%d PaymentReceived entries, want a's alone", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND detail LIKE '%' || $2 || '%'`, u.ID, a.ID); n != 1 {
		t.Fatalf("%d gateway_mismatch cases naming the holder %s, want 1", n, a.ID)
	}
}
