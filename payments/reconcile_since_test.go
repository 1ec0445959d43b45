package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

func reconcileSince(t *testing.T, svc *payments.Service, since time.Duration) payments.ReconcileReport {
	t.Helper()
	rep, err := svc.ReconcileSince(context.Background(), since, payments.ReconcileConfig{})
	if err != nil {
		t.Fatalf("reconcile since %s: %v", since, err)
	}
	return rep
}

func findingKinds(rep payments.ReconcileReport) map[string]int {
	kinds := map[string]int{}
	for _, f := range rep.Findings {
		kinds[f.Kind]++
	}
	return kinds
}

// An on-demand run over the last 24 h: a late payment on a Failed session, a duplicate gateway
// payment and a settled active session are found, the first two open one case each (listed as
// opened), the third is driven to Completed; a session last changed two days ago is not even
// asked about. The patrol's cursor is not touched and the lease is given back. A second run finds
// the same differences but opens nothing: the cases are already open.
func TestReconcileSinceReportsFindingsAndTheCasesItOpened(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cmd := b.service(b.pool, "cmd-reconcile")

	old := b.registered(t, "o-old", 100)
	b.gw.SetStatus(old.GatewayPaymentID, payments.GatewaySucceeded) // would be driven, if it were in the window
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET updated_at = $2 WHERE id = $1`, old.ID, t0.Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	dead := b.registered(t, "o-dead", 200)
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewayDeclined)
	if s, err := b.plain.Check(ctx, api, dead.ID); err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded) // the money came anyway
	dup := b.registered(t, "o-dup", 300)
	b.secondPayment(t, dup)
	paid := b.registered(t, "o-paid", 400)
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	b.clock.Advance(time.Minute)

	rep := reconcileSince(t, cmd, 24*time.Hour)
	if !rep.Leader || rep.LeaderID != "cmd-reconcile" || rep.Checked != 3 || !rep.PassDone || rep.Errors != 0 || rep.LostLeadership {
		t.Fatalf("run: %+v", rep)
	}
	if !rep.Since.Equal(b.clock.Now().Add(-24 * time.Hour)) {
		t.Errorf("window from %s, want 24 h before %s", rep.Since, b.clock.Now())
	}
	if k := findingKinds(rep); k[payments.CaseLatePayment] != 1 || k[payments.CaseDuplicatePayment] != 1 || k[payments.FindingDriven] != 1 || len(rep.Findings) != 3 {
		t.Fatalf("findings %+v", rep.Findings)
	}
	for _, f := range rep.Findings {
		want := map[string]string{payments.CaseLatePayment: dead.ID, payments.CaseDuplicatePayment: dup.ID, payments.FindingDriven: paid.ID}[f.Kind]
		if f.SessionID != want || f.OrderID == "" || f.Detail == "" {
			t.Errorf("finding %+v, want it about session %s", f, want)
		}
	}
	if len(rep.CasesOpened) != 2 {
		t.Fatalf("cases opened %+v, want 2", rep.CasesOpened)
	}
	for _, c := range rep.CasesOpened {
		if !(c.Kind == payments.CaseLatePayment && c.SessionID == dead.ID && c.OrderID == "o-dead") &&
			!(c.Kind == payments.CaseDuplicatePayment && c.SessionID == dup.ID && c.OrderID == "o-dup") {
			t.Errorf("unexpected case %+v", c)
		}
	}
	if k := b.count(t, `SELECT count(*) FROM finance_cases`); k != 2 {
		t.Fatalf("%d cases in the table, want the 2 reported", k)
	}
	if s, _ := b.svc.Get(ctx, paid.ID); s.Status != payments.StatusCompleted {
		t.Errorf("paid session %s, want Completed", s.Status)
	}
	if s, _ := b.svc.Get(ctx, old.ID); s.Status != payments.StatusRegistered || b.gw.PaymentCalls(fakegw.OpFind, old.ID) != 0 {
		t.Errorf("the session outside the window: %s, asked %d times", s.Status, b.gw.PaymentCalls(fakegw.OpFind, old.ID))
	}
	if k := b.count(t, `SELECT count(*) FROM maintenance_leaders`) + b.count(t, `SELECT count(*) FROM reconcile_cursors`); k != 0 {
		t.Fatalf("the run left %d lease or cursor rows (it must give the lease back and leave the patrol's cursor alone)", k)
	}

	b.clock.Advance(time.Minute)
	rep = reconcileSince(t, cmd, 24*time.Hour)
	if k := findingKinds(rep); rep.Checked != 3 || k[payments.CaseLatePayment] != 1 || k[payments.CaseDuplicatePayment] != 1 || k[payments.FindingDriven] != 0 || len(rep.CasesOpened) != 0 {
		t.Fatalf("second run: %+v", rep)
	}
	if k := b.count(t, `SELECT count(*) FROM finance_cases`); k != 2 {
		t.Fatalf("%d cases after the second run, want still 2", k)
	}
	if _, err := cmd.ReconcileSince(ctx, 0, payments.ReconcileConfig{}); payments.ErrorCode(err) != payments.EINVALID {
		t.Errorf("a zero window: %v, want invalid", err)
	}
}

// patrolParkedOnThreeSessions registers three sessions and starts replica-a's patrol run, held at
// its first find (the session it is on is returned); later finds are held too until Unhold.
func (b *bench) patrolParkedOnThreeSessions(t *testing.T) (*fakegw.Gate, <-chan reconcileOut, string) {
	t.Helper()
	for _, order := range []string{"o-1", "o-2", "o-3"} {
		b.registered(t, order, 100)
	}
	b.clock.Advance(time.Minute)
	gate := b.gw.Hold(fakegw.OpFind)
	t.Cleanup(gate.Open)
	running := goReconcile(b.svc, "replica-a", payments.ReconcileConfig{})
	first := mustWait(t, gate.Arrived(), "the patrol's first find")
	return gate, running, first
}

// The lease: an on-demand run is refused while the patrol's leader is in a run (parked at the
// gateway here), and asks the gateway nothing; it takes the lease from the same leader once that
// one is between runs, and while it runs a patrol is refused in turn; when it ends the lease is
// free and the patrol takes it at once.
func TestReconcileSinceNeverRunsBesideAnotherRun(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cmd := b.service(testdb.Pool(t, b.url), "cmd-reconcile")
	other := b.service(testdb.Pool(t, b.url), "replica-b")
	gate, running, _ := b.patrolParkedOnThreeSessions(t)
	rep := reconcileSince(t, cmd, time.Hour)
	if rep.Leader || rep.LeaderID != "replica-a" || rep.Checked != 0 {
		t.Fatalf("on demand while the patrol runs: %+v", rep)
	}
	if n := b.gw.Calls(fakegw.OpFind); n != 1 {
		t.Fatalf("%d finds, want only the parked patrol's", n)
	}
	b.gw.Unhold(fakegw.OpFind)
	gate.Open()
	if out := mustWait(t, running, "the patrol's run"); out.err != nil || !out.rep.Leader || out.rep.Checked != 3 {
		t.Fatalf("patrol: %+v %v", out.rep, out.err)
	}
	// The patrol still leads between its runs: another patrol is refused.
	if rep := reconcile(t, other, payments.ReconcileConfig{}); rep.Leader || rep.LeaderID != "replica-a" {
		t.Fatalf("replica-b while replica-a leads, between runs: %+v", rep)
	}

	gate = b.gw.Hold(fakegw.OpFind)
	onDemand := make(chan reconcileOut, 1)
	go func() {
		rep, err := cmd.ReconcileSince(context.Background(), time.Hour, payments.ReconcileConfig{})
		onDemand <- reconcileOut{"cmd-reconcile", rep, err}
	}()
	mustWait(t, gate.Arrived(), "the on-demand run's first find")
	for _, svc := range []*payments.Service{b.svc, other} {
		if rep := reconcile(t, svc, payments.ReconcileConfig{}); rep.Leader || rep.LeaderID != "cmd-reconcile" {
			t.Fatalf("a patrol while the on-demand run runs: %+v", rep)
		}
	}
	b.gw.Unhold(fakegw.OpFind)
	gate.Open()
	if out := mustWait(t, onDemand, "the on-demand run"); out.err != nil || !out.rep.Leader || out.rep.Checked != 3 {
		t.Fatalf("on demand between the patrol's runs: %+v %v", out.rep, out.err)
	}
	if rep := reconcile(t, other, payments.ReconcileConfig{}); !rep.Leader {
		t.Fatalf("a patrol right after the on-demand run: %+v", rep)
	}
	if n := b.gw.Calls(fakegw.OpFind); n != 9 {
		t.Fatalf("%d finds, want 3 runs × 3 sessions", n)
	}
}

// The negative control: a patrol run whose running mark is gone (as if runs were not marked)
// looks idle, and the on-demand run takes the lease beside it: every session is asked about by
// both (the patrol, finding the lease free again when it renews, carries on).
func TestReconcileSinceWithoutTheRunningMarkRunsBesideThePatrol(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	cmd := b.service(testdb.Pool(t, b.url), "cmd-reconcile")
	gate, running, first := b.patrolParkedOnThreeSessions(t)
	b.gw.Unhold(fakegw.OpFind)
	if _, err := b.pool.Exec(context.Background(), `UPDATE maintenance_leaders SET running_until = NULL`); err != nil {
		t.Fatal(err)
	}
	rep := reconcileSince(t, cmd, time.Hour)
	if !rep.Leader || rep.Checked != 3 {
		t.Fatalf("on demand without the mark: %+v", rep)
	}
	gate.Open()
	if out := mustWait(t, running, "the patrol's run"); out.err != nil || out.rep.Checked == 0 {
		t.Fatalf("patrol: %+v %v", out.rep, out.err)
	}
	if n := b.gw.PaymentCalls(fakegw.OpFind, first); n != 2 {
		t.Fatalf("the patrol's session was asked about %d times, want 2: both ran", n)
	}
	if n := b.gw.Calls(fakegw.OpFind); n != 6 {
		t.Fatalf("%d finds, want 6: two runs over 3 sessions", n)
	}
}
