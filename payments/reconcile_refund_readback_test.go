package payments_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// Reading refunds back (reconcile_refunds.go). Negative controls, run by hand: without the
// readBackRefunds call in reconcileSession all four fail (no refund is asked about again once
// Succeeded, so no case opens and nothing is counted); without the window's condition in
// readBackRefunds' query, TestReconcileReadsBackOnlyRefundsWithinTheWindow fails (both refunds
// read back).

// refundedAt is a Completed payment of 1000 with one refund of 400 settled Succeeded by the
// gateway's answer (its RefundIssued entry written).
func (b *bench) refundedAt(t *testing.T, order string) (payments.Session, payments.Refund) {
	t.Helper()
	s := b.completed(t, order, 1000)
	r := b.refundIn(t, s, 400, order+"/refund")
	if r.Status != payments.RefundSucceeded || r.GatewayRefundID == "" {
		t.Fatalf("setup: refund %+v", r)
	}
	return s, r
}

// wantBooksUnchanged: the refund is still Succeeded with its one RefundIssued entry.
func (b *bench) wantBooksUnchanged(t *testing.T, r payments.Refund) {
	t.Helper()
	got, err := b.svc.GetRefund(context.Background(), r.ID)
	if err != nil || got.Status != payments.RefundSucceeded {
		t.Fatalf("refund after the read-back: %+v %v, want it Succeeded as it was", got, err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND refund_id = $1`, r.ID); n != 1 {
		t.Fatalf("RefundIssued entries of the refund = %d, want 1 (the ledger is people's to correct)", n)
	}
}

// A refund settled Succeeded that the gateway later reports failed (Stripe moves a card refund
// succeeded → failed and gives the money back to the merchant): reconciliation's next pass opens
// one gateway_mismatch case naming the refund, and changes neither the refund nor the ledger. A
// second pass adds nothing to the open case; once finance resolved it, the same news opens no
// new case.
func TestReconcileReadsBackARefundTheGatewayFailedLater(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s, r := b.refundedAt(t, "o-rb-failed")
	b.gw.SetRefundStatus(s.GatewayPaymentID, "failed")

	b.clock.Advance(time.Minute)
	rep := reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.RefundsReadBack != 1 || rep.RefundContradictions != 1 || rep.Mismatches != 1 || rep.Errors != 0 {
		t.Fatalf("first pass: %+v", rep)
	}
	var caseID int64
	var detail string
	var facts []string
	if err := b.pool.QueryRow(ctx, `SELECT id, detail, facts FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL`,
		s.ID).Scan(&caseID, &detail, &facts); err != nil {
		t.Fatalf("no open gateway_mismatch case: %v", err)
	}
	for _, want := range []string{r.ID, r.GatewayRefundID, "Succeeded here", "failed", "may not have been refunded", "resolve this case"} {
		if !strings.Contains(detail, want) {
			t.Errorf("the case's detail does not say %q: %s", want, detail)
		}
	}
	if len(facts) != 1 || !strings.Contains(facts[0], r.ID) {
		t.Errorf("the case's facts = %q, want the refund's one", facts)
	}
	b.wantBooksUnchanged(t, r)

	b.clock.Advance(time.Minute)
	rep = reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.RefundContradictions != 1 {
		t.Fatalf("second pass: %+v", rep)
	}
	var again string
	if err := b.pool.QueryRow(ctx, `SELECT detail FROM finance_cases WHERE id = $1`, caseID).Scan(&again); err != nil || again != detail {
		t.Fatalf("the open case changed at the second pass (%v):\n%s\nwas\n%s", err, again, detail)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1`, s.ID); n != 1 {
		t.Fatalf("cases after the second pass = %d, want 1", n)
	}

	b.resolveOpenCase(t, s.ID, payments.CaseGatewayMismatch, "refunded the customer by hand at the gateway, ticket FIN-31")
	for range 2 {
		b.clock.Advance(time.Minute)
		reconcile(t, b.svc, payments.ReconcileConfig{})
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1`, s.ID); n != 1 {
		t.Fatalf("cases after finance resolved the same news = %d, want 1 (%v)", n, b.openCaseKinds(t, s.ID))
	}
	b.wantBooksUnchanged(t, r)
}

// A refund settled longer ago than RefundReadBack is not asked about; one within it is, once a
// pass.
func TestReconcileReadsBackOnlyRefundsWithinTheWindow(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s := b.completed(t, "o-rb-window", 1000)
	old := b.refundIn(t, s, 100, "old")
	b.clock.Advance(2 * time.Hour)
	recent := b.refundIn(t, s, 200, "recent")
	b.clock.Advance(time.Minute)
	cfg := payments.ReconcileConfig{RefundReadBack: time.Hour}
	rep := reconcile(t, b.svc, cfg)
	if rep.RefundsReadBack != 1 || rep.RefundContradictions != 0 {
		t.Fatalf("pass: %+v", rep)
	}
	if n := b.gw.PaymentCalls(fakegw.OpRefundStatus, old.GatewayRefundID); n != 0 {
		t.Errorf("the refund settled 2h ago was asked about %d times with a window of 1h, want 0", n)
	}
	if n := b.gw.PaymentCalls(fakegw.OpRefundStatus, recent.GatewayRefundID); n != 1 {
		t.Errorf("the refund settled a minute ago was asked about %d times in one pass, want 1", n)
	}
	if n := b.gw.Calls(fakegw.OpFindRefund); n != 0 {
		t.Errorf("refunds looked up by key: %d, want 0 (both have the gateway's id)", n)
	}
}

// An answer that says nothing (a 5xx) opens nothing and fails nothing: the session counts as
// compared, and the next pass asks again and finds the refund failed.
func TestReconcileRefundReadBackUnknownAnswerOpensNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s, r := b.refundedAt(t, "o-rb-unknown")
	b.gw.SetRefundStatus(s.GatewayPaymentID, "failed")
	b.gw.Fail(fakegw.OpRefundStatus, fakegw.Transient, 1)

	b.clock.Advance(time.Minute)
	rep := reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.RefundsReadBack != 0 || rep.RefundContradictions != 0 || rep.Errors != 0 || rep.Checked != 1 || !rep.PassDone {
		t.Fatalf("pass with the gateway answering 503: %+v", rep)
	}
	if n := b.gw.PaymentCalls(fakegw.OpRefundStatus, r.GatewayRefundID); n != 1 {
		t.Fatalf("refund asked about %d times, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1`, s.ID); n != 0 {
		t.Fatalf("cases after an unknown answer = %d, want 0", n)
	}

	b.clock.Advance(time.Minute)
	rep = reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.RefundContradictions != 1 {
		t.Fatalf("next pass: %+v", rep)
	}
	if kinds := b.openCaseKinds(t, s.ID); len(kinds) != 1 || kinds[0] != payments.CaseGatewayMismatch {
		t.Fatalf("open cases after the gateway answered = %v, want one gateway_mismatch", kinds)
	}
	b.wantBooksUnchanged(t, r)
}

// A refund the gateway agrees with (succeeded, same refund, payment and amount) is asked about
// and opens nothing.
func TestReconcileRefundReadBackAgreementOpensNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s, r := b.refundedAt(t, "o-rb-agrees")
	b.clock.Advance(time.Minute)
	rep := reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.RefundsReadBack != 1 || rep.RefundContradictions != 0 || rep.Mismatches != 0 {
		t.Fatalf("pass: %+v", rep)
	}
	if n := b.gw.PaymentCalls(fakegw.OpRefundStatus, r.GatewayRefundID); n != 1 {
		t.Fatalf("refund asked about %d times, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1`, s.ID); n != 0 {
		t.Fatalf("cases after the gateway agreed = %d, want 0", n)
	}
}

// A refund made ten days after its payment completed: the pass visits the sessions changed
// within its lookback (7 days), and a refund did not move its payment's updated_at, so it was
// never read back (the helper that built the read-back said so). Settling a refund Succeeded
// moves it now. Negative control (run by hand): without that, no case.
func TestReconcileReadsBackARefundOfAnOlderPayment(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-rb-older", 1000)
	b.clock.Advance(10 * 24 * time.Hour)
	r := b.refundIn(t, s, 400, "o-rb-older/refund")
	if r.Status != payments.RefundSucceeded {
		t.Fatalf("setup: refund %+v", r)
	}
	b.gw.SetRefundStatus(s.GatewayPaymentID, "failed")
	b.clock.Advance(time.Minute)
	if rep := reconcile(t, b.svc, payments.ReconcileConfig{}); rep.RefundContradictions != 1 {
		t.Fatalf("pass after a refund of a payment ten days old: %+v, want its refund read back and contradicted", rep)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL`, s.ID); n != 1 {
		t.Fatalf("%d open cases, want 1", n)
	}
	b.wantBooksUnchanged(t, r)
	_ = ctx
}

// refundStatusGW answers chosen refunds' RefundStatus itself; everything else is the fake's.
type refundStatusGW struct {
	*fakegw.Gateway
	mu       sync.Mutex
	override map[string]func(payments.GatewayRefund) (payments.GatewayRefund, error)
}

func (g *refundStatusGW) RefundStatus(ctx context.Context, rid string) (payments.GatewayRefund, error) {
	gr, err := g.Gateway.RefundStatus(ctx, rid)
	g.mu.Lock()
	f := g.override[rid]
	g.mu.Unlock()
	if f != nil && err == nil {
		return f(gr)
	}
	return gr, err
}

func refundStatusBench(t *testing.T) (*bench, *refundStatusGW) {
	b := newBench(t)
	agw := &refundStatusGW{Gateway: b.gw, override: map[string]func(payments.GatewayRefund) (payments.GatewayRefund, error){}}
	b.svc = b.service(b.pool, "replica-a", func(c *payments.Config) { c.Gateway = agw })
	return b, agw
}

// An older refund the gateway now calls failed was never read back while a newer refund of the
// same session got a refusal of its own look-up every pass: the read-back stopped at the first
// error, newest first (a review). A refusal of one refund's look-up moves on to the next.
// Negative control (run by hand): stopping at every error, no case.
func TestReconcileReadBackGoesPastOneRefundsRefusal(t *testing.T) {
	t.Parallel()
	b, agw := refundStatusBench(t)
	s := b.completed(t, "o-rb-refusal", 1000)
	older := b.refundIn(t, s, 100, "older")
	b.clock.Advance(time.Minute)
	newer := b.refundIn(t, s, 200, "newer")
	agw.override[older.GatewayRefundID] = func(gr payments.GatewayRefund) (payments.GatewayRefund, error) {
		gr.Status = "failed"
		return gr, nil
	}
	agw.override[newer.GatewayRefundID] = func(payments.GatewayRefund) (payments.GatewayRefund, error) {
		return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: "refund_status", HTTPStatus: 400, Code: "invalid_request"}
	}
	total := 0
	for range 3 {
		b.clock.Advance(time.Minute)
		rep := reconcile(t, b.svc, payments.ReconcileConfig{})
		total += rep.RefundContradictions
	}
	if total == 0 || len(b.openCaseKinds(t, s.ID)) == 0 {
		t.Fatalf("3 passes: refund %s failed at the gateway was never read back (the newer refund %s's look-up error stopped the session's read-back every pass); open cases %v",
			older.ID, newer.ID, b.openCaseKinds(t, s.ID))
	}
}

// A status short of final ("processing", "requires_action": a gateway that passes its own
// words through, as refgw does) is pending to driveRefund, which asks again, but it opened a
// "may not have been refunded" case in the read-back (a review). Only failed contradicts.
// Negative control (run by hand): any status but succeeded and pending, a case.
func TestReconcileReadBackTakesAStatusShortOfFinalAsPending(t *testing.T) {
	t.Parallel()
	for _, st := range []string{"processing", "requires_action"} {
		b, agw := refundStatusBench(t)
		s, r := b.refundedAt(t, "o-rb-"+st)
		agw.override[r.GatewayRefundID] = func(gr payments.GatewayRefund) (payments.GatewayRefund, error) {
			gr.Status = st
			return gr, nil
		}
		b.clock.Advance(time.Minute)
		rep := reconcile(t, b.svc, payments.ReconcileConfig{})
		if rep.RefundContradictions != 0 || len(b.openCaseKinds(t, s.ID)) != 0 {
			var detail string
			_ = b.pool.QueryRow(context.Background(), `SELECT detail FROM finance_cases WHERE session_id = $1`, s.ID).Scan(&detail)
			t.Errorf("gateway says %q (not final; driveRefund would ask again): case opened: %s", st, detail)
		}
	}
}

// A refund the gateway left pending, settled Failed by four eyes (no RefundIssued entry, its
// amount refundable again), that the gateway pays a day later: the books say the customer was
// not refunded, the gateway that they were, and nothing told finance — the read-back asked only
// about refunds settled Succeeded, and only the payment's next refund would have asked
// (recheckRefundsFailedByHand), which may never come (an outside review, chaos5). The payment
// completed ten days before the refund: settling it Failed by hand moves the payment's
// updated_at too, so the pass (sessions changed within 7 days) visits it. Reconciliation opens
// one gateway_mismatch case naming the refund, changes neither the refund nor the ledger, adds
// nothing at the next pass, and opens nothing again once finance resolved it. Negative controls
// (run by hand): with the read-back of Succeeded refunds alone, no case; without the payment's
// updated_at moved by the hand settlement, no case (the payment is outside the pass).
func TestReconcileReadsBackARefundSettledFailedByHand(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s := b.completed(t, "o-rb-failed-by-hand", 1000)
	b.clock.Advance(10 * 24 * time.Hour)
	b.gw.SetRefundOutcome("pending")
	res, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 600, RequestKey: "k"})
	if err != nil || res.Refund.Status != payments.RefundPending {
		t.Fatalf("refund = %+v %v", res, err)
	}
	b.runOutRefundSchedule(t)
	p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: res.Refund.ID, Outcome: payments.RefundFailed,
		Reason: "the gateway's support: it will not be executed", Evidence: "ticket GW-5"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	r, err := b.svc.GetRefund(ctx, res.Refund.ID)
	if err != nil || !r.FailedByHand() || r.GatewayRefundID == "" {
		t.Fatalf("setup: %+v %v", r, err)
	}

	// Still pending at the gateway, which is why it was settled by hand: no news.
	b.clock.Advance(time.Hour)
	if rep := reconcile(t, b.svc, payments.ReconcileConfig{}); rep.RefundsReadBack != 1 || rep.RefundContradictions != 0 {
		t.Fatalf("pass while the gateway still says pending: %+v, want the refund read back and nothing contradicted", rep)
	}
	// Failed at the gateway too: the books agree.
	b.gw.SetRefundStatus(s.GatewayPaymentID, "failed")
	b.clock.Advance(time.Hour)
	if rep := reconcile(t, b.svc, payments.ReconcileConfig{}); rep.RefundsReadBack != 1 || rep.RefundContradictions != 0 {
		t.Fatalf("pass while the gateway agrees: %+v, want the refund read back and nothing contradicted", rep)
	}

	// Paid after all.
	b.gw.SetRefundStatus(s.GatewayPaymentID, "succeeded")
	b.clock.Advance(24 * time.Hour)
	rep := reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.RefundsReadBack != 1 || rep.RefundContradictions != 1 || rep.Errors != 0 {
		t.Fatalf("pass after the gateway paid it: %+v", rep)
	}
	var caseID int64
	var detail string
	if err := b.pool.QueryRow(ctx, `SELECT id, detail FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL`,
		s.ID).Scan(&caseID, &detail); err != nil {
		t.Fatalf("no open gateway_mismatch case: %v", err)
	}
	for _, want := range []string{r.ID, r.GatewayRefundID, "Failed here", "succeeded", "may have been refunded", "mark it Succeeded"} {
		if !strings.Contains(detail, want) {
			t.Errorf("the case's detail does not say %q: %s", want, detail)
		}
	}
	wantFailedUnbooked := func() {
		t.Helper()
		got, err := b.svc.GetRefund(ctx, r.ID)
		if err != nil || got.Status != payments.RefundFailed {
			t.Fatalf("refund after the read-back: %+v %v, want it Failed as it was", got, err)
		}
		if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND refund_id = $1`, r.ID); n != 0 {
			t.Fatalf("RefundIssued entries of the refund = %d, want none (the ledger is people's to correct)", n)
		}
	}
	wantFailedUnbooked()

	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	var again string
	if err := b.pool.QueryRow(ctx, `SELECT detail FROM finance_cases WHERE id = $1`, caseID).Scan(&again); err != nil || again != detail {
		t.Fatalf("the open case changed at the second pass (%v):\n%s\nwas\n%s", err, again, detail)
	}
	b.resolveOpenCase(t, s.ID, payments.CaseGatewayMismatch, "checked at the gateway: paid; correction proposed, FIN-40")
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); n != 1 {
		t.Fatalf("gateway_mismatch cases after finance resolved the same news = %d, want 1", n)
	}
	wantFailedUnbooked()
}
