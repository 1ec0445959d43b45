package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

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
	unknown := b.unregistered(t, "o-old-gw-unknown", 1000)
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

// A gateway event found by our reference names a session of another gateway (GATEWAY changed;
// the patrol before the fix registered such sessions again at the new gateway, and the customer
// paid there): the session is left alone, the event an unknown payment, and finance has a
// duplicate_gateway_payment case on the session naming the payment.
// Before, the lookup by reference was not filtered by gateway: the new gateway's payment was
// attached to the old gateway's session and Completed it, after which neither gateway's replicas
// could look after it (an outside review of the session's diff). Negative control: without the
// gateway in the lookup by reference, the session is Completed with the new gateway's payment.
func TestAWebhookByReferenceLeavesASessionOfAnotherGatewayAlone(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	old := b.unregistered(t, "o-old-gw-hook", 1000)
	b.exec(t, `UPDATE payment_sessions SET gateway = 'old' WHERE id = $1`, old.ID)
	// The payment the pre-fix patrol registered at this (the new) gateway under the old session's
	// reference, now paid by the customer.
	gp := b.atThisGateway(t, old)
	b.gw.SetStatus(gp.ID, payments.GatewaySucceeded)

	r, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-other-gw", Type: "payment.updated", PaymentID: gp.ID, Reference: old.ID})
	if err != nil {
		t.Fatal(err)
	}
	after, err := b.svc.Get(ctx, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.GatewayPaymentID != "" || after.Status != payments.StatusUnknown {
		t.Fatalf("a webhook of this gateway applied its payment %s to session %s of gateway %q: now %s with gateway payment %q (outcome %s)",
			gp.ID, old.ID, after.Gateway, after.Status, after.GatewayPaymentID, r.Outcome)
	}
	// Finance is told: the customer may have paid at this gateway for the old session.
	if r.Outcome != payments.EventUnknownPayment || b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'duplicate_gateway_payment'
		AND resolved_at IS NULL AND detail LIKE '%' || $2 || ' (succeeded%'`, old.ID, gp.ID) != 1 {
		t.Fatalf("outcome %s, and no open duplicate_gateway_payment case naming %s succeeded on session %s", r.Outcome, gp.ID, old.ID)
	}
}

// The same event about a session of another gateway that already carries a gateway id (the
// patrol before the fix attached the new gateway's re-registration to it) is an unknown payment
// too, processed once: it went by reference to Check, which answers 409 other_gateway, and the
// patrol retried it every 5 minutes for ever, PitlaneWebhookEventsUnprocessed never clearing (an
// outside review of the session's diff). Negative control: without the gateway in the lookup by
// reference, still unprocessed after 11 tries.
func TestAWebhookAboutASessionOfAnotherGatewayIsNotRetriedForever(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	old := b.unregistered(t, "o-old-gw-hook2", 1000)
	gp := b.atThisGateway(t, old)
	b.exec(t, `UPDATE payment_sessions SET gateway = 'old', gateway_payment_id = $2, status = 'Registered' WHERE id = $1`, old.ID, gp.ID)
	b.gw.SetStatus(gp.ID, payments.GatewaySucceeded)
	b.paymentUpdated(t, "evt-other-gw-2", gp.ID, old.ID)
	for i := 0; i < 10; i++ {
		b.clock.Advance(6 * time.Minute)
		if _, err := b.svc.RetryWebhooksOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var attempts int
	var errText string
	if err := b.pool.QueryRow(ctx, `SELECT attempts, coalesce(error, '') FROM webhook_events WHERE event_id = 'evt-other-gw-2' AND processed_at IS NULL`).Scan(&attempts, &errText); err == nil {
		t.Fatalf("the event is still unprocessed after %d tries (%s): retried every 5 minutes for ever", attempts, errText)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'duplicate_gateway_payment' AND resolved_at IS NULL`, old.ID); n != 1 {
		t.Fatalf("%d open duplicate_gateway_payment cases on the old gateway's session, want one", n)
	}
}

// The case about a payment at the new gateway for an old gateway's session is about other money:
// a four-eyes settlement of the old session (Unknown at its own gateway, "nothing was taken
// there", proposed before the event came) leaves it open. The first version opened a
// gateway_mismatch case, which settlements close, its facts let go: the captured payment was on
// no open case, no session, no ledger (the session's own review). Negative control: with
// CaseGatewayMismatch, the case is closed by the approval.
func TestSettlingTheOldSessionLeavesTheCaseAboutMoneyAtTheNewGateway(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	old := b.unregistered(t, "o-probe-other-gw-settle", 1000)
	b.exec(t, `UPDATE payment_sessions SET gateway = 'old' WHERE id = $1`, old.ID)
	// Finance: the old gateway has nothing for this Unknown session; proposes Failed.
	p := b.propose(t, fin1, old.ID, payments.StatusFailed)
	// The payment the pre-fix patrol registered at this (the new) gateway, paid by the customer.
	gp := b.atThisGateway(t, old)
	b.gw.SetStatus(gp.ID, payments.GatewaySucceeded)
	if r, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-probe-settle", Type: "payment.updated", PaymentID: gp.ID, Reference: old.ID}); err != nil || r.Outcome != payments.EventUnknownPayment {
		t.Fatalf("event: %+v %v", r, err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL AND detail LIKE '%' || $2 || '%'`, old.ID, gp.ID); n != 1 {
		t.Fatalf("premise: %d open cases naming %s", n, gp.ID)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	inReview, err := b.svc.PaymentInReview(ctx, old.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE resolved_at IS NULL AND detail LIKE '%' || $1 || '%'`, gp.ID); n != 1 {
		var res string
		_ = b.pool.QueryRow(ctx, `SELECT coalesce(resolution, '') FROM finance_cases WHERE detail LIKE '%' || $1 || '%'`, gp.ID).Scan(&res)
		t.Fatalf("the case about %s captured at the new gateway was closed by the old session's settlement (%q): no open case names it; checkout in review: %v",
			gp.ID, res, inReview)
	}
}

// An event of this gateway about a declined payment under an old gateway's session (nothing was
// taken) opens no case: the first version opened a gateway_mismatch case, and the order's
// checkout was refused ("our bank reported a payment") until finance resolved it (the session's
// own review). Negative control: without the status look in otherGatewaysPayment, a case.
func TestADeclinedPaymentAtTheNewGatewayOpensNoCase(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	old := b.failed(t, "o-probe-other-gw-declined", 1000) // settled Failed: the order may be paid again
	b.exec(t, `UPDATE payment_sessions SET gateway = 'old' WHERE id = $1`, old.ID)
	gp := b.atThisGateway(t, old)
	b.gw.SetStatus(gp.ID, payments.GatewayDeclined)
	if in, err := b.svc.PaymentInReview(ctx, old.OrderID); err != nil || in {
		t.Fatalf("premise: in review %v %v", in, err)
	}
	if _, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-probe-declined", Type: "payment.declined", PaymentID: gp.ID, Reference: old.ID}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, old.ID); n != 0 {
		t.Fatalf("a declined payment (nothing taken) at the new gateway opened %d cases", n)
	}
}

// atThisGateway is a payment at the bench's gateway under old's reference: what the patrol
// registered there for a session of another gateway before it looked at the session's gateway.
func (b *bench) atThisGateway(t *testing.T, old payments.Session) payments.GatewayPayment {
	t.Helper()
	gp, err := b.gw.Register(context.Background(), payments.RegisterRequest{IdempotencyKey: "again-" + old.ID, Reference: old.ID, Amount: old.Amount, Currency: old.Currency})
	if err != nil {
		t.Fatal(err)
	}
	return gp
}

// A capture at this gateway under an old gateway's Failed session whose event arrives while
// this gateway's status read does not answer once: the case was noted with a fact without a
// status, which holds no checkout (paymentInReviewSQL), and the event was done with
// (unknown_payment): reconciliation asks the session's own, old gateway only, so a Pay click
// started a new payment while the customer's money sat at this gateway (an outside review). The
// event waits for the patrol's retry, which reads the capture. Negative control: otherGatewaysPayment
// going on without the payment's status.
func TestACaptureAtTheNewGatewayReadWhenTheGatewayAnswers(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	old := b.failed(t, "o-other-gw-silent", 1000)
	b.exec(t, `UPDATE payment_sessions SET gateway = 'old' WHERE id = $1`, old.ID)
	gp := b.atThisGateway(t, old)
	b.gw.SetStatus(gp.ID, payments.GatewaySucceeded)
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1) // the event's status read gets no answer
	r, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt-silent", Type: "payment.succeeded", PaymentID: gp.ID, Reference: old.ID})
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != payments.EventQueued {
		t.Errorf("the event whose payment could not be read: %s, want %s", r.Outcome, payments.EventQueued)
	}
	b.clock.Advance(6 * time.Minute)
	if _, err := b.svc.RetryWebhooksOnce(ctx); err != nil {
		t.Fatal(err)
	}
	before := b.gw.Calls(fakegw.OpRegister)
	_, perr := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: old.OrderID, Amount: 1000, Currency: "EUR"}, 0)
	if in, err := b.svc.PaymentInReview(ctx, old.OrderID); err != nil || !in || perr != payments.ErrPaymentInReview || b.gw.Calls(fakegw.OpRegister) != before {
		t.Errorf("%s captured at this gateway for Failed %s: in review %v (%v), a Pay click: %v, %d new registrations; open cases %v",
			gp.ID, old.ID, in, err, perr, b.gw.Calls(fakegw.OpRegister)-before, b.casesNaming(t, old.ID, gp.ID))
	}
}
