package payments_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// endlessSearch is a gateway whose search for one reference never ends on its own (Stripe's
// search following a next_page cursor that looped back, before TestASearchWhosePagesNeverEndAnswersUnknown
// in stripegw; a call hanging past its timeout): it returns only when its caller's context does.
type endlessSearch struct {
	*fakegw.Gateway
	ref string
}

func (g *endlessSearch) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	if ref == g.ref {
		<-ctx.Done()
		return nil, &payments.GatewayError{Kind: payments.FailureUnknown, Op: "find", Err: ctx.Err()}
	}
	return g.Gateway.FindByReference(ctx, ref)
}

// TestAReconcileSessionOutlastingTheLeaseIsSkippedLikeAnyFailure: one session whose comparison
// outlasted the run's lease was never counted as a failure ("past the leadership: not the
// session's fault, nothing to count"), so never skipped: every run, on every replica, started on
// it again and ended with the lease, and reconciliation of every other session of the gateway
// stopped for good (an outside review, reconcile3). Each session now has a bound of its own
// (compareSession), two thirds of the lease: it fails as the session's failure, retried, then
// skipped. The lease is short here (300 ms of the run's own timer), a bound, not a wait.
func TestAReconcileSessionOutlastingTheLeaseIsSkippedLikeAnyFailure(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.seedRegistered(t, 2)
	order := b.sessionsInScanOrder(t)
	gw := &endlessSearch{Gateway: b.gw, ref: order[0]}
	svc := b.service(b.pool, "replica-endless", func(c *payments.Config) { c.Gateway = gw })
	cfg := payments.ReconcileConfig{MaxFailures: 3, LeaderTTL: 300 * time.Millisecond}
	var errs []string
	for run := range cfg.MaxFailures + 2 {
		rep, err := svc.ReconcileOnceWith(context.Background(), cfg)
		errs = append(errs, fmt.Sprintf("run %d: checked %d errors %d skipped %d err %v", run, rep.Checked, rep.Errors, rep.Skipped, err))
	}
	if k := b.gw.PaymentCalls(fakegw.OpFind, order[1]); k == 0 {
		t.Fatalf("after %d runs the second session was never compared: every run started on the endless one and ended with its lease, no failure counted:\n%v",
			cfg.MaxFailures+2, errs)
	}
}

// TestAReconcileSinceMovesPastASessionOutlastingTheLease: the same for `pitlane reconcile
// --since`: the session cut every on-demand run at its lease (exit 1, "run it again") and the run
// again started on it. Now it is a finding, and the run moves on.
func TestAReconcileSinceMovesPastASessionOutlastingTheLease(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.seedRegistered(t, 2)
	order := b.sessionsInScanOrder(t)
	gw := &endlessSearch{Gateway: b.gw, ref: order[0]}
	svc := b.service(b.pool, "replica-endless-since", func(c *payments.Config) { c.Gateway = gw })
	cfg := payments.ReconcileConfig{LeaderTTL: 300 * time.Millisecond}
	var errs []string
	for run := range 2 {
		rep, err := svc.ReconcileSince(context.Background(), time.Hour, cfg)
		errs = append(errs, fmt.Sprintf("run %d: checked %d errors %d findings %d err %v", run, rep.Checked, rep.Errors, len(rep.Findings), err))
	}
	if k := b.gw.PaymentCalls(fakegw.OpFind, order[1]); k == 0 {
		t.Fatalf("after 2 on-demand runs the second session was never compared, and the endless one was never reported as a finding:\n%v", errs)
	}
}
