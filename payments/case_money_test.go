package payments_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// casesNaming lists "kind: facts" of the session's open cases whose facts name gateway payment id.
func (b *bench) casesNaming(t *testing.T, sessionID, id string) []string {
	t.Helper()
	return b.texts(t, `SELECT kind || ': ' || array_to_string(facts, '; ') FROM finance_cases
		WHERE session_id = $1 AND resolved_at IS NULL AND EXISTS (SELECT 1 FROM unnest(facts) f WHERE f LIKE $2 || ' (%')
		ORDER BY id`, sessionID, id)
}

// dupHoldsMoneyThenFailed: a gateway that ignored our key holds B (captured) beside S's own A
// (pending). A duplicate case about B's money opens while S is Registered (found by `finder`).
// Then A expires and S's Check makes S Failed.
func dupHoldsMoneyThenFailed(t *testing.T, b *bench, order, finder string) (payments.Session, payments.GatewayPayment) {
	t.Helper()
	ctx := context.Background()
	s := b.registered(t, order, 700)
	second := b.secondPayment(t, s)
	b.gw.SetStatus(second.ID, payments.GatewaySucceeded)
	b.clock.Advance(time.Minute)
	switch finder {
	case "reconciliation":
		reconcile(t, b.svc, payments.ReconcileConfig{})
	case "webhook":
		b.paymentUpdated(t, "evt_b_"+order, second.ID, s.ID)
	}
	if got := b.casesNaming(t, s.ID, second.ID); len(got) != 1 || !strings.HasPrefix(got[0], payments.CaseDuplicatePayment) {
		t.Fatalf("setup: open cases naming %s: %v, want one duplicate case", second.ID, got)
	}
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayExpired)
	if got, err := b.plain.Check(ctx, api, s.ID); err != nil || got.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", got.Status, err)
	}
	return s, second
}

// An outside review (a gateway that ignores our keys, end to end). B's money was reported in a duplicate case while S was active; once S is Failed the
// next reconciliation (or B's next webhook) opens a late_payment case about the same B too: one
// sum, two open cases, each inviting finance to give B's money back (the promise: one case per
// sum). TestOneLatePaymentOpensOneCase covers only the order "Failed first, then found". The late
// news about a payment an open duplicate case names goes to that case (noteLatePayment).
// Negative control: reconcileCase's and secondPayment's late facts to noteCase directly.
func TestADuplicateCaseThenFailedIsOneCaseForOneSum(t *testing.T) {
	t.Parallel()
	for _, later := range []string{"reconciliation", "webhook"} {
		t.Run(later, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			s, second := dupHoldsMoneyThenFailed(t, b, "o-audit-dup-then-failed-"+later, "reconciliation")
			b.clock.Advance(time.Minute)
			switch later {
			case "reconciliation":
				reconcile(t, b.svc, payments.ReconcileConfig{})
			case "webhook":
				b.paymentUpdated(t, "evt_b_again", second.ID, s.ID)
			}
			if got := b.casesNaming(t, s.ID, second.ID); len(got) != 1 {
				t.Errorf("open cases about the one captured payment %s = %d, want 1:\n%s", second.ID, len(got), strings.Join(got, "\n"))
			}
		})
	}
}

// The same review. The same state before the next reconciliation: B's money sits in an open duplicate
// case of a Failed session, and the order's checkout is not "in review": a Pay click starts a
// new session and a new gateway payment (the third), where ErrPaymentInReview was promised.
// Negative control: paymentInReviewSQL without duplicate cases holding money.
func TestCheckoutStartsNoPaymentWhileADuplicateHoldsMoney(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s, second := dupHoldsMoneyThenFailed(t, b, "o-audit-dup-review", "webhook")
	inReview, err := b.svc.PaymentInReview(ctx, s.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	before := b.gw.Calls(fakegw.OpRegister)
	res, perr := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: s.OrderID, Amount: 700, Currency: "EUR"}, 0)
	if after := b.gw.Calls(fakegw.OpRegister); !inReview || after != before {
		t.Errorf("captured %s sits in an open %s case of Failed %s; PaymentInReview = %v, and a Pay click made session %s (%v) with %d new registration(s)",
			second.ID, b.openCaseKinds(t, s.ID), s.ID, inReview, res.Session.ID, perr, after-before)
	}
}

// The same review. A late_payment case about S's own payment A is open (its Check found A captured
// after S failed). A second payment B under S's reference is captured too, and its webhook is
// lost: reconciliation finds both. reconcileCase uses openCase, which drops the new fact while a
// case of the kind is open, so B's money is on no open case; once finance resolves the case
// (refunding A), the next reconciliation opens a new one naming A again beside B. Negative
// control: openCase in reconcileCase.
func TestASecondLatePaymentFoundByReconciliationReachesFinanceOnce(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.failed(t, "o-audit-two-late", 700) // A declined: Failed
	second := b.secondPayment(t, s)
	// A captured after all (a late payment: Check says so), and B captured too.
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.plain.Check(ctx, api, s.ID); err != nil {
		t.Fatal(err)
	}
	a, _ := b.gw.Payment(s.GatewayPaymentID)
	if got := b.casesNaming(t, s.ID, a.ID); len(got) != 1 {
		t.Fatalf("setup: open cases naming A: %v", got)
	}
	b.gw.SetStatus(second.ID, payments.GatewaySucceeded)
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	if got := b.casesNaming(t, s.ID, second.ID); len(got) != 1 {
		t.Errorf("after reconciliation found captured B %s: open cases naming it: %v, want 1 (open: %v)", second.ID, got, b.openCaseKinds(t, s.ID))
	}
	// Finance refunds A and resolves the case; the next pass must not name A again.
	b.resolveOpenCase(t, s.ID, payments.CaseLatePayment, "refunded at the gateway")
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	if got := b.casesNaming(t, s.ID, a.ID); len(got) != 0 {
		t.Errorf("A %s, whose case finance resolved, is named again in an open case: %v", a.ID, got)
	}
}

// A duplicate case about B's money that finance resolved (refunded B by hand) is not asked again
// as a late payment when the session fails: one sum, one decision (moneyKinds). Negative
// control: factsResolved by the kind alone.
func TestAResolvedDuplicateIsNotAskedAgainAsALatePayment(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-dup-resolved-then-failed", 700)
	second := b.secondPayment(t, s)
	b.gw.SetStatus(second.ID, payments.GatewaySucceeded)
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	b.resolveOpenCase(t, s.ID, payments.CaseDuplicatePayment, "refunded B by hand at the gateway, ticket FIN-90")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayExpired)
	if got, err := b.plain.Check(ctx, api, s.ID); err != nil || got.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", got.Status, err)
	}
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, payments.ReconcileConfig{})
	b.paymentUpdated(t, "evt_b_late", second.ID, s.ID)
	if kinds := b.openCaseKinds(t, s.ID); len(kinds) != 0 {
		t.Errorf("B %s, whose duplicate case finance resolved, came back as %v once the session failed", second.ID, kinds)
	}
}

// A review of the session's diff: a payment at this gateway under an old gateway's Failed session is first reported
// pending (a duplicate case: nothing held yet), then captured. otherGatewaysPayment notes it with
// openCase, which drops the capture while the case is open; paymentInReviewSQL looks only at the
// case's facts, so the order's checkout started a new payment while this money was held.
// Negative control: openCase in otherGatewaysPayment.
func TestACaptureAtTheNewGatewayHoldsTheCheckout(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	old := b.failed(t, "o-other-gw-capture", 1000)
	b.exec(t, `UPDATE payment_sessions SET gateway = 'old' WHERE id = $1`, old.ID)
	gp := b.atThisGateway(t, old) // pending
	b.paymentUpdated(t, "evt-other-pending", gp.ID, old.ID)
	b.gw.SetStatus(gp.ID, payments.GatewaySucceeded)
	b.paymentUpdated(t, "evt-other-succeeded", gp.ID, old.ID)
	facts := b.texts(t, `SELECT array_to_string(facts, '; ') FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, old.ID)
	inReview, err := b.svc.PaymentInReview(ctx, old.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	before := b.gw.Calls(fakegw.OpRegister)
	res, perr := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: old.OrderID, Amount: 1000, Currency: "EUR"}, 0)
	if after := b.gw.Calls(fakegw.OpRegister); !inReview || after != before {
		t.Errorf("%s captured at this gateway for Failed %s; open case facts %v; PaymentInReview = %v; a Pay click made session %s (%v), %d new registration(s)",
			gp.ID, old.ID, facts, inReview, res.Session.ID, perr, after-before)
	}
}

// A payment finance resolved is not named again beside a new one: S failed, its late payment A
// was resolved (refunded by hand at the gateway: A still reads succeeded); a second payment B is
// captured later and its webhook is lost. Reconciliation found A and B holding money and the
// new late_payment case named both (factsResolved was all or nothing), asking finance about the
// sum it had refunded (an outside review); the same for a duplicate case whose B finance resolved
// when a third payment C is captured. The new case names the new payment, and its detail says
// which were resolved before. Negative control: noteCase and openCase with every fact (newsOf
// returning facts as they are unless all are resolved).
func TestAResolvedPaymentIsNotNamedAgainBesideANewOne(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{payments.CaseLatePayment, payments.CaseDuplicatePayment} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			ctx := context.Background()
			var s payments.Session
			var resolved payments.GatewayPayment
			if kind == payments.CaseLatePayment {
				s = b.failed(t, "o-resolved-then-late", 700) // its own A declined: Failed
				b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
				if _, err := b.plain.Check(ctx, api, s.ID); err != nil {
					t.Fatal(err)
				}
				resolved, _ = b.gw.Payment(s.GatewayPaymentID)
			} else {
				s = b.registered(t, "o-resolved-then-dup", 700)
				resolved = b.secondPayment(t, s)
				b.gw.SetStatus(resolved.ID, payments.GatewaySucceeded)
				b.clock.Advance(time.Minute)
				reconcile(t, b.svc, payments.ReconcileConfig{})
			}
			b.resolveOpenCase(t, s.ID, kind, "refunded "+resolved.ID+" by hand at the gateway, ticket FIN-1")

			next := b.secondPayment(t, s)
			b.gw.SetStatus(next.ID, payments.GatewaySucceeded)
			b.clock.Advance(time.Minute)
			reconcile(t, b.svc, payments.ReconcileConfig{})
			if got := b.casesNaming(t, s.ID, next.ID); len(got) != 1 || !strings.HasPrefix(got[0], kind) {
				t.Fatalf("%s captured since: open cases naming it %v, want one %s case", next.ID, got, kind)
			}
			if got := b.casesNaming(t, s.ID, resolved.ID); len(got) != 0 {
				t.Errorf("%s, whose case finance resolved, is named again in an open case: %v", resolved.ID, got)
			}
			detail := b.texts(t, `SELECT detail FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, s.ID)
			if len(detail) != 1 || !strings.Contains(detail[0], "resolved in an earlier case: "+resolved.ID+" (") {
				t.Errorf("the new case's detail %q does not say %s was resolved before", detail, resolved.ID)
			}
			reconcile(t, b.svc, payments.ReconcileConfig{}) // and nothing more on the next pass
			if got := b.texts(t, `SELECT detail FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL`, s.ID); !slices.Equal(got, detail) {
				t.Errorf("the next pass changed the case: %q, was %q", got, detail)
			}
		})
	}
}

// A Check of a Failed session with no gateway payment attached (settled Failed by people while
// its registration's answer was lost) finds two payments under its reference, both captured: the
// one it attaches was noted as a late payment, the other dropped (not a duplicate: late money of
// a session that is over is its late case's; not the late case's either: only the attached one
// is applied). Both reach the late_payment case. Negative control: gatewayState without its
// noteLatePayment of the others.
func TestACheckOfAFailedSessionNotesEveryLatePaymentItFinds(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.failed(t, "o-check-two-late", 700)
	b.exec(t, `UPDATE payment_sessions SET gateway_payment_id = NULL WHERE id = $1`, s.ID)
	second := b.secondPayment(t, s)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	b.gw.SetStatus(second.ID, payments.GatewaySucceeded)
	b.clock.Advance(time.Minute)
	if _, err := b.plain.Check(ctx, api, s.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{s.GatewayPaymentID, second.ID} {
		if got := b.casesNaming(t, s.ID, id); len(got) != 1 || !strings.HasPrefix(got[0], payments.CaseLatePayment) {
			t.Errorf("%s captured for Failed %s: open cases naming it %v, want one late_payment case", id, s.ID, got)
		}
	}
}
