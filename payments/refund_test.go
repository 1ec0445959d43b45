package payments_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

func (b *bench) completed(t *testing.T, orderID string, amount int64) payments.Session {
	t.Helper()
	s := b.registered(t, orderID, amount)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	s, err := b.plain.Check(context.Background(), api, s.ID)
	if err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	return s
}

func TestRefundRules(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	open := b.registered(t, "o-open", 1000)
	if _, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: open.ID, Amount: 100, RequestKey: "k0"}); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("refund of a Registered payment = %v, want conflict", err)
	}
	s := b.completed(t, "o-refund", 1000)
	if _, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 0, RequestKey: "k"}); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("zero amount = %v", err)
	}
	r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "k1"})
	if err != nil || !r.Created || r.Refund.Status != payments.RefundSucceeded {
		t.Fatalf("refund = %+v %v", r, err)
	}
	again, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "k1"})
	if err != nil || again.Created || again.Refund.ID != r.Refund.ID {
		t.Fatalf("same request again = %+v %v", again, err)
	}
	if b.gw.Calls(fakegw.OpRefund) != 1 {
		t.Fatalf("gateway refunds = %d", b.gw.Calls(fakegw.OpRefund))
	}
	if _, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 601, RequestKey: "k2"}); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("over-refund = %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND refund_id IS NOT NULL`); n != 1 {
		t.Fatalf("RefundIssued entries = %d", n)
	}
	got, err := b.svc.GetRefund(ctx, r.Refund.ID)
	if err != nil || got.Amount != 400 || got.PaymentID != s.ID {
		t.Fatalf("get = %+v %v", got, err)
	}
}

// Ten refunds of 300 at once on a 1000 payment, from two replicas: the order → session locks
// make the remaining-amount check exact: three succeed, seven are refused.
func TestRefundsConcurrentStayWithinAmount(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s := b.completed(t, "o-many", 1000)
	other := b.service(b.pool, "replica-b")
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	start := make(chan struct{})
	for i := range 10 {
		svc := b.svc
		if i%2 == 1 {
			svc = other
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := svc.CreateRefund(context.Background(), api, payments.RefundInput{PaymentID: s.ID, Amount: 300, RequestKey: fmt.Sprint("k", i)})
			mu.Lock()
			outcomes[payments.ErrorCode(err)]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if outcomes[""] != 3 || outcomes[payments.ECONFLICT] != 7 {
		t.Fatalf("outcomes = %v, want 3 ok and 7 conflicts", outcomes)
	}
	if n := b.count(t, `SELECT coalesce(sum(amount), 0)::int FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 900 {
		t.Fatalf("refunded = %d", n)
	}
}

// No answer from the gateway: the refund stays Pending and the patrol repeats it with the same
// key; one ledger entry.
func TestRefundLostAnswerDrivenByPatrol(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-lost-refund", 1000)
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1)
	r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 1000, RequestKey: "k"})
	if err != nil || r.Refund.Status != payments.RefundPending {
		t.Fatalf("refund = %+v %v", r, err)
	}
	if n, _ := b.svc.DriveRefunds(ctx); n != 0 {
		t.Fatal("driven before due")
	}
	b.clock.Advance(time.Minute)
	if n, err := b.svc.DriveRefunds(ctx); err != nil || n != 1 {
		t.Fatalf("drive = %d %v", n, err)
	}
	got, _ := b.svc.GetRefund(ctx, r.Refund.ID)
	if got.Status != payments.RefundSucceeded || b.gw.KeyCalls(fakegw.OpRefund, r.Refund.ID) != 2 {
		t.Fatalf("after patrol: %s, calls with key %d", got.Status, b.gw.KeyCalls(fakegw.OpRefund, r.Refund.ID))
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 1 {
		t.Fatalf("ledger entries = %d", n)
	}
}
