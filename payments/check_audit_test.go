package payments_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// "Check now" read the payment Registered; between the gateway's answer and its apply another
// path (here a Check of the shop's) applied Completed. Check now's apply changed nothing, yet its
// audit entry said "check now: Registered → Completed" under the finance user while the timeline
// gives the transition to the other actor (an outside review, console actions under
// concurrency). Negative control (run by hand): the detail from the status read before, the
// transition credited to the finance user.
func TestCheckNowAuditsOnlyTheChangeItApplied(t *testing.T) {
	t.Parallel()
	var once sync.Once
	var b *bench
	var raced string // the payment whose apply another path overtakes
	b = newBench(t, func(c *payments.Config) {
		c.Hooks.AfterGatewayStatus = func(ctx context.Context, id string, _ payments.GatewayPayment) {
			if id != raced {
				return
			}
			once.Do(func() {
				if _, err := b.plain.Check(context.Background(), api, id); err != nil {
					t.Errorf("the other check: %v", err)
				}
			})
		}
	})
	ctx := context.Background()
	s := b.registered(t, "o-checknow-audit-raced", 1000)
	raced = s.ID
	own := b.registered(t, "o-checknow-audit-own", 1000)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	b.gw.SetStatus(own.GatewayPaymentID, payments.GatewaySucceeded)
	res, err := b.svc.CheckNow(ctx, fin1, []string{s.ID, own.ID})
	if err != nil || len(res) != 2 {
		t.Fatalf("check now = %+v %v", res, err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = $1 AND entry_type = 'PaymentReceived'`, s.OrderID); n != 1 {
		t.Fatalf("PaymentReceived entries = %d, want 1", n)
	}
	details := b.texts(t, `SELECT detail FROM audit_log WHERE action = 'payment.check' AND target = $1`, s.ID)
	if len(details) != 1 || !strings.Contains(details[0], "not by this check") {
		t.Errorf("audit of the raced check = %q, want the change named as another path's (the timeline: %v)", details,
			b.texts(t, `SELECT actor_kind || ':' || actor_id FROM session_events WHERE session_id = $1 AND to_status = 'Completed'`, s.ID))
	}
	if details := b.texts(t, `SELECT detail FROM audit_log WHERE action = 'payment.check' AND target = $1`, own.ID); len(details) != 1 || details[0] != "check now: Registered → Completed" {
		t.Errorf("audit of the check that applied it = %q, want %q", details, "check now: Registered → Completed")
	}
}

// One person checks one payment twice at once (two tabs, or a second click without
// JavaScript): the second check's answer is applied first (Registered → Completed) and the
// first check applies nothing. Its audit entry still said "Registered → Completed": the check's
// transition was read back from the timeline as any of the same actor's since it began, so the
// one transition was claimed by both checks (an outside review, console). A check's own
// transition is what its applies committed. Negative control (run by hand): read back from the
// timeline by actor, both entries claim it.
func TestTwoChecksOfOnePersonAuditTheTransitionOnce(t *testing.T) {
	t.Parallel()
	var once sync.Once
	var b *bench
	by := fin1.Actor()
	b = newBench(t, func(c *payments.Config) {
		c.Hooks.AfterGatewayStatus = func(ctx context.Context, id string, _ payments.GatewayPayment) {
			once.Do(func() { // the other tab's check, answered and applied while this one waits
				_, detail, err := b.plain.CheckAudited(context.Background(), by, id, payments.StatusRegistered)
				if err != nil || detail != "Registered → Completed" {
					t.Errorf("the other tab's check = %q %v, want it to have applied the transition", detail, err)
				}
			})
		}
	})
	s := b.registered(t, "o-two-checks-one-person", 1000)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	_, detail, err := b.svc.CheckAudited(context.Background(), by, s.ID, payments.StatusRegistered)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status = 'Completed'`, s.ID); n != 1 {
		t.Fatalf("%d transitions to Completed, want 1", n)
	}
	if want := "Registered → Completed (applied meanwhile by another path, not by this check)"; detail != want {
		t.Errorf("the overtaken check says %q, want %q", detail, want)
	}
}

// A Check whose gateway did not answer changed nothing, for certain, and was audited "outcome
// unknown (it may have happened)" as a database failure is (a review of AuditOutcome): only an
// action the database failed is unknown. Negative control (run by hand): every EUNAVAIL unknown.
func TestACheckWithTheGatewayDownIsAuditedAsRefused(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s := b.registered(t, "o-check-gateway-down", 1000)
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	_, detail, err := b.svc.CheckAudited(context.Background(), fin1.Actor(), s.ID, s.Status)
	if payments.ErrorCode(err) != payments.EUNAVAIL {
		t.Fatalf("check = %v, want unavailable", err)
	}
	if !strings.HasPrefix(detail, "refused: ") {
		t.Errorf("audit detail = %q, want refused (nothing was applied)", detail)
	}
}
