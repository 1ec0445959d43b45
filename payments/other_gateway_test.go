package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A session registered at another gateway than this replica's (GATEWAY changed on a database with
// payments under way) is sent nothing by this replica: the patrol does not claim it, nor a refund
// of it; a Check answers a conflict naming its gateway; a confirmed cancel and a refund wait for
// its own gateway's replicas. Before, an Unknown session of the old gateway was registered again
// at the new one (a second payment for one session), a refund sent where its money is not (an
// outside review, stripe). Negative control: with gwOf answering this replica's gateway and the
// claims unfiltered, the patrol registers the Unknown session (register calls 2) and the refund
// is sent.
func TestASessionOfAnotherGatewayIsSentNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.gw.Fail(fakegw.OpRegister, fakegw.Transient, 1) // nothing made: Unknown, no gateway id
	res, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-old-gw-unknown", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil || res.Session.Status != payments.StatusUnknown {
		t.Fatalf("setup: %s %v", res.Session.Status, err)
	}
	unknown := res.Session
	paid := b.completed(t, "o-old-gw-paid", 1000)
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1) // no answer: Pending, the patrol asks again
	if r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: paid.ID, Amount: 100, RequestKey: "k-old-gw"}); err != nil || r.Refund.Status != payments.RefundPending {
		t.Fatalf("setup: refund %+v %v, want Pending", r.Refund, err)
	}
	live := b.registered(t, "o-old-gw-live", 1000)
	b.exec(t, `UPDATE payment_sessions SET gateway = 'old' WHERE id = ANY($1)`, []string{unknown.ID, paid.ID, live.ID})
	ops := []string{fakegw.OpRegister, fakegw.OpStatus, fakegw.OpFind, fakegw.OpReverse, fakegw.OpRefund, fakegw.OpRefundStatus, fakegw.OpFindRefund}
	calls := func() (n int) {
		for _, op := range ops {
			n += b.gw.Calls(op)
		}
		return n
	}
	before := calls()

	b.clock.Advance(time.Hour)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := calls() - before; n != 0 || b.gw.PaymentsWithReference(unknown.ID) != 0 {
		t.Fatalf("the patrol made %d gateway calls about sessions of another gateway (%d payments under the Unknown one's reference), want none",
			n, b.gw.PaymentsWithReference(unknown.ID))
	}
	if _, err := b.svc.Check(ctx, api, unknown.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("Check of a session of another gateway: %v, want a conflict naming it", err)
	}
	ch, err := b.svc.RequestCancel(ctx, api, live.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := b.svc.ConfirmCancel(ctx, api, live.ID, ch.ID, b.lastCode(t, live.ID)); err != nil || r.Session.Status != payments.StatusCanceling {
		t.Fatalf("confirm: %s %v, want Canceling for its gateway's replicas", r.Session.Status, err)
	}
	b.clock.Advance(time.Hour)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := calls() - before; n != 0 {
		t.Fatalf("%d gateway calls about sessions of another gateway after a Check, a cancel and the patrol, want none", n)
	}
}
