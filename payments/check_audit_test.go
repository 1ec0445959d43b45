package payments_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"pitlane/payments"
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
