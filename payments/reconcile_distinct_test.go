package payments_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// doubledSearch is a gateway whose search lists every payment twice, the second copy as its
// index held it earlier (pending): a paginated search whose index moved between its pages.
type doubledSearch struct{ *fakegw.Gateway }

func (g doubledSearch) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	ps, err := g.Gateway.FindByReference(ctx, ref)
	var out []payments.GatewayPayment
	for _, p := range ps {
		stale := p
		stale.Status = payments.GatewayPending
		out = append(out, stale, p)
	}
	return out, err
}

// One payment listed twice by the gateway's search is one payment: neither reconciliation nor a
// Check opens a duplicate case for it, and a Failed session's late payment is judged by its
// copy further along (succeeded), not the stale one. Before, two copies of the session's own
// payment opened a duplicate_gateway_payment case on every pass (an outside review).
func TestOnePaymentListedTwiceIsNoDuplicate(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	svc := payments.NewService(b.pool, payments.Config{Gateway: doubledSearch{b.gw}, Clock: b.clock, ReplicaID: "replica-doubled",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})

	own := b.registered(t, "o-twice-own", 900)
	dead := b.failed(t, "o-twice-late", 700)
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded) // captured after all
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	lost := b.createIn(t, "o-twice-lost", 500, "EUR")
	if lost.Status != payments.StatusUnknown || lost.GatewayPaymentID != "" {
		t.Fatalf("setup: %+v, want Unknown with its answer lost", lost)
	}
	got, err := svc.Check(ctx, api, lost.ID)
	if err != nil || got.GatewayPaymentID == "" {
		t.Fatalf("check of the lost registration: %+v %v", got, err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE kind = 'duplicate_gateway_payment'`); n != 0 {
		t.Fatalf("the check opened %d duplicate cases for one payment listed twice", n)
	}

	b.clock.Advance(time.Minute)
	rep := reconcile(t, svc, payments.ReconcileConfig{})
	if rep.Duplicates != 0 || rep.LatePayments != 1 || rep.Mismatches != 0 {
		t.Fatalf("report %+v: want the late payment only", rep)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE kind = 'duplicate_gateway_payment'`); n != 0 {
		t.Fatalf("%d duplicate cases for payments listed twice", n)
	}
	var fact string
	if err := b.pool.QueryRow(ctx, `SELECT array_to_string(facts, ' ') FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID).Scan(&fact); err != nil {
		t.Fatal(err)
	}
	if want := dead.GatewayPaymentID; !strings.Contains(fact, want) || !strings.Contains(fact, string(payments.GatewaySucceeded)) {
		t.Fatalf("late payment case's facts %q: want %s succeeded", fact, want)
	}
	if got, _ := svc.Get(ctx, own.ID); got.Status != payments.StatusRegistered {
		t.Fatalf("own session after reconcile: %s", got.Status)
	}
}
