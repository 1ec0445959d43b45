package payments_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pitlane/payments"
)

// A review of the session's diff: secondPayment answered nil for money a second payment B holds for a Failed
// session ("the session's late_payment case holds it"), but nothing opens that late_payment case
// except reconciliation, which compares only sessions updated within its Lookback (7 days). B
// authorized, captured more than a week after the session failed: its webhook opened a duplicate
// case before that diff, then no case ever opened. The webhook opens the late_payment case.
// Negative control: returning nil for it.
func TestASecondPaymentCapturedForALongFailedSessionReachesFinance(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-audit7-late-b", 700)
	second := b.secondPayment(t, s)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayDeclined)
	if got, err := b.plain.Check(ctx, api, s.ID); err != nil || got.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", got.Status, err)
	}
	b.clock.Advance(8 * 24 * time.Hour)
	b.gw.SetStatus(second.ID, payments.GatewaySucceeded) // money taken for a Failed session
	if _, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_b_captured", Type: "payment.updated",
		PaymentID: second.ID, Reference: s.ID}); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, s.ID); n != 1 {
		t.Errorf("open cases about %s, captured for Failed session %s = %d, want 1", second.ID, s.ID, n)
	}
}

// The same review: noteCase caps a case's detail at 8,000 characters but still merges the news'
// facts. Once at the cap, news changes the facts and not the detail, so FinanceCase.Seen (md5 of
// the detail) is unchanged: a resolve on what was read before the news goes through, the news'
// fact counted as resolved, and no finder raised it again. Seen covers the facts too. Negative
// control: md5 of the detail alone.
func TestNewsPastACasesDetailCapIsNotResolvedUnread(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-audit7-cap", 700)
	second := b.secondPayment(t, s) // pending: may still take money
	for i := range 70 {
		b.clock.Advance(time.Minute)
		if _, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: fmt.Sprintf("evt_b_%03d", i), Type: "payment.updated",
			PaymentID: second.ID, Reference: s.ID}); err != nil {
			t.Fatal(err)
		}
	}
	page, err := b.svc.ListCases(ctx, false, 0)
	if err != nil || len(page.Cases) != 1 {
		t.Fatalf("setup: cases %+v %v", page.Cases, err)
	}
	read := page.Cases[0]
	if len(read.Detail) < 7900 {
		t.Fatalf("setup: detail only %d chars", len(read.Detail))
	}
	b.clock.Advance(time.Minute)
	b.gw.SetStatus(second.ID, payments.GatewaySucceeded) // the second charge, after finance read the case
	if _, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_b_captured", Type: "payment.updated",
		PaymentID: second.ID, Reference: s.ID}); err != nil {
		t.Fatal(err)
	}
	_, err = b.svc.ResolveCase(ctx, fin1, read.ID, "pending second payment, it will expire: nothing to do", read.Seen())
	if payments.ErrorCode(err) != payments.ECONFLICT {
		t.Errorf("resolve of a case whose facts gained the capture of %s after it was read: err = %v, want ECONFLICT", second.ID, err)
	}
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, s.ID); n != 1 {
		t.Errorf("open cases about the capture of %s nobody read = %d, want 1", second.ID, n)
	}
}

// The same review: queueHolds read `lock_token = $4 AND completed_at IS NULL` into a bool. A key
// abandoned by a refused takeover (giveUp: !Fresh → Abandon) has lock_token NULL and no
// completion: the read is NULL, its Scan fails, and the slow first request's whole claim batch
// fails: an internal error (500) where the order's state answers 409 (another active payment).
// Negative control: the read without coalesce.
func TestASlowCreateAfterARefusedTakeoverIsNotInternal(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{})
	r := idemReq(cl.ID, "k-audit7-null", `{"amount":100,"currency":"EUR"}`)
	in := payments.CreateInput{OrderID: "o-audit7-null", Amount: 100, Currency: "EUR"}
	effect := func(gate <-chan struct{}, entered chan<- struct{}) payments.Effect {
		return func(ctx context.Context, slot payments.Slot) (string, int, error) {
			if entered != nil {
				entered <- struct{}{}
			}
			if gate != nil {
				<-gate
			}
			in := in
			in.FirstAttempt, in.Bind = slot.Fresh, slot.Binding
			res, err := b.svc.Create(ctx, api, in)
			return res.Session.ID, 201, err
		}
	}
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	type result struct {
		out payments.Outcome
		err error
	}
	aDone := make(chan result, 1)
	go func() {
		out, err := x.Run(ctx, r, effect(gate, entered))
		aDone <- result{out, err}
	}()
	mustWait(t, entered, "A holds the key, before its claim")
	// Meanwhile the shop's other path starts a payment of another amount for the order.
	if _, err := b.plain.Create(ctx, api, payments.CreateInput{OrderID: in.OrderID, Amount: 250, Currency: "EUR"}); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	if _, err := x.Run(ctx, r, effect(nil, nil)); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("setup: B = %v, want a conflict", err)
	}
	close(gate)
	a := mustWait(t, aDone, "A")
	if code := payments.ErrorCode(a.err); code == payments.EINTERNAL {
		t.Errorf("the slow first request's claim after a refused takeover: %v (code %s), want a 409", a.err, code)
	}
}
