package payments_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

type reconcileOut struct {
	who string
	rep payments.ReconcileReport
	err error
}

func goReconcile(svc *payments.Service, who string, cfg payments.ReconcileConfig) <-chan reconcileOut {
	ch := make(chan reconcileOut, 1)
	go func() {
		rep, err := svc.ReconcileOnceWith(context.Background(), cfg)
		ch <- reconcileOut{who, rep, err}
	}()
	return ch
}

func reconcile(t *testing.T, svc *payments.Service, cfg payments.ReconcileConfig) payments.ReconcileReport {
	t.Helper()
	rep, err := svc.ReconcileOnceWith(context.Background(), cfg)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return rep
}

// sessionsInScanOrder lists the session ids in the order the reconciler walks them.
func (b *bench) sessionsInScanOrder(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT id::text FROM payment_sessions ORDER BY updated_at, id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// Two replicas call the reconciler at the same moment. The one that got the leader row is held at
// its first gateway call (so it is provably mid-run) while the other finishes: it was refused
// the row and asked the gateway nothing. Every session is asked about exactly once.
func TestReconcileTwoReplicasOneRuns(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	other := b.service(testdb.Pool(t, b.url), "replica-b")
	n := 6
	b.seedRegistered(t, n)
	refs := b.sessionsInScanOrder(t)
	gate := b.gw.Hold(fakegw.OpFind)

	a := goReconcile(b.svc, "replica-a", payments.ReconcileConfig{})
	c := goReconcile(other, "replica-b", payments.ReconcileConfig{})
	mustWait(t, gate.Arrived(), "the leader's first find")
	// The leader is parked at the gateway; the other one must come back on its own.
	var loser, winner reconcileOut
	select {
	case loser = <-a:
	case loser = <-c:
	case <-time.After(20 * time.Second):
		t.Fatal("the second replica did not return while the leader was mid-run")
	}
	if loser.err != nil || loser.rep.Leader || loser.rep.Checked != 0 {
		t.Fatalf("%s while the other leads: %+v %v", loser.who, loser.rep, loser.err)
	}
	if b.gw.Calls(fakegw.OpFind) != 1 {
		t.Fatalf("%d finds with the leader parked at its first, want 1", b.gw.Calls(fakegw.OpFind))
	}
	gate.Open()
	if loser.who == "replica-a" {
		winner = mustWait(t, c, "the leader")
	} else {
		winner = mustWait(t, a, "the leader")
	}
	if winner.err != nil || !winner.rep.Leader || winner.rep.Checked != n || !winner.rep.PassDone {
		t.Fatalf("leader %s: %+v %v", winner.who, winner.rep, winner.err)
	}
	if loser.rep.LeaderID != winner.who {
		t.Fatalf("the refused replica names %q as leader, want %q", loser.rep.LeaderID, winner.who)
	}
	for _, ref := range refs {
		if k := b.gw.PaymentCalls(fakegw.OpFind, ref); k != 1 {
			t.Fatalf("session %s looked up %d times, want 1", ref, k)
		}
	}
	if k := b.count(t, `SELECT count(*) FROM gateway_calls WHERE operation = 'find' AND replica_id = $1`, winner.who); k != n {
		t.Fatalf("the leader logged %d find calls, want %d", k, n)
	}
	if k := b.count(t, `SELECT count(*) FROM gateway_calls WHERE operation = 'find' AND replica_id = $1`, loser.who); k != 0 {
		t.Fatalf("the refused replica logged %d find calls", k)
	}
}

// The negative control: the same two replicas, but the leader row is gone while the leader is
// mid-run (as if there were no election). The second replica runs too, and sessions are asked
// about twice. The leader, finding the row taken when it renews, stops after the session it was
// on, so the damage is that one session (and every effect is idempotent anyway).
func TestReconcileWithoutLeaderRowBothReplicasRun(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	other := b.service(testdb.Pool(t, b.url), "replica-b")
	n := 6
	b.seedRegistered(t, n)
	refs := b.sessionsInScanOrder(t)
	gate := b.gw.Hold(fakegw.OpFind)
	a := goReconcile(b.svc, "replica-a", payments.ReconcileConfig{})
	first := mustWait(t, gate.Arrived(), "replica-a's first find")
	b.gw.Unhold(fakegw.OpFind) // later finds go straight through
	if _, err := b.pool.Exec(context.Background(), `DELETE FROM maintenance_leaders`); err != nil {
		t.Fatal(err)
	}
	repB := reconcile(t, other, payments.ReconcileConfig{})
	if !repB.Leader || repB.Checked != n {
		t.Fatalf("replica-b without the row: %+v", repB)
	}
	gate.Open()
	outA := mustWait(t, a, "replica-a")
	if outA.err != nil || !outA.rep.Leader || !outA.rep.LostLeadership || outA.rep.Checked != 1 {
		t.Fatalf("replica-a: %+v %v", outA.rep, outA.err)
	}
	twice := 0
	for _, ref := range refs {
		if b.gw.PaymentCalls(fakegw.OpFind, ref) > 1 {
			twice++
		}
	}
	if twice != 1 || b.gw.PaymentCalls(fakegw.OpFind, first) != 2 || b.gw.Calls(fakegw.OpFind) != n+1 {
		t.Fatalf("without the leader row: %d sessions asked twice (want 1: %s), %d finds (want %d)",
			twice, first, b.gw.Calls(fakegw.OpFind), n+1)
	}
}

// The leader's row expires by the (manual) clock; the other replica takes over and carries on
// from the cursor the first one left: no session is asked about twice, none is missed.
func TestReconcileTakeoverAfterTTLContinuesFromCursor(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	other := b.service(testdb.Pool(t, b.url), "replica-b")
	b.seedRegistered(t, 10)
	order := b.sessionsInScanOrder(t)
	cfg := payments.ReconcileConfig{Batch: 4, LeaderTTL: 5 * time.Minute}

	if rep := reconcile(t, b.svc, cfg); !rep.Leader || rep.Checked != 4 || rep.PassDone {
		t.Fatalf("replica-a, first batch: %+v", rep)
	}
	if rep := reconcile(t, other, cfg); rep.Leader || rep.LeaderID != "replica-a" {
		t.Fatalf("replica-b while replica-a leads: %+v", rep)
	}
	// replica-a dies without giving the row back. Just before its TTL ends the row is still its.
	b.clock.Advance(cfg.LeaderTTL - time.Second)
	if rep := reconcile(t, other, cfg); rep.Leader {
		t.Fatalf("replica-b took the row before it expired: %+v", rep)
	}
	b.clock.Advance(time.Second)
	if rep := reconcile(t, other, cfg); !rep.Leader || rep.Checked != 4 || rep.PassDone {
		t.Fatalf("replica-b after the TTL: %+v", rep)
	}
	if rep := reconcile(t, b.svc, cfg); rep.Leader || rep.LeaderID != "replica-b" {
		t.Fatalf("replica-a back after the takeover: %+v", rep)
	}
	if rep := reconcile(t, other, cfg); !rep.Leader || rep.Checked != 2 || !rep.PassDone {
		t.Fatalf("replica-b, end of the pass: %+v", rep)
	}
	for i, id := range order {
		want := "replica-a"
		if i >= 4 {
			want = "replica-b"
		}
		var got []string
		rows, err := b.pool.Query(context.Background(), `SELECT replica_id FROM gateway_calls WHERE operation = 'find' AND session_id = $1`, id)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var r string
			_ = rows.Scan(&r)
			got = append(got, r)
		}
		rows.Close()
		if len(got) != 1 || got[0] != want {
			t.Fatalf("session #%d (%s) looked up by %v, want once by %s", i, id, got, want)
		}
	}
	if k := b.count(t, `SELECT count(*) FROM reconcile_cursors WHERE passes = 1 AND pass_started_at IS NULL AND after_id IS NULL AND updated_by = 'replica-b'`); k != 1 {
		t.Fatal("the cursor does not show one finished pass by replica-b")
	}
	// A new pass starts over.
	if rep := reconcile(t, other, cfg); !rep.Leader || rep.Checked != 4 {
		t.Fatalf("new pass: %+v", rep)
	}
}

// A replica that gives the row back (graceful shutdown) is replaced at once, not after the TTL,
// and the cursor survives the handover.
func TestReconcileReleasedLeadershipHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	other := b.service(testdb.Pool(t, b.url), "replica-b")
	b.seedRegistered(t, 4)
	cfg := payments.ReconcileConfig{Batch: 2}
	if rep := reconcile(t, b.svc, cfg); !rep.Leader || rep.Checked != 2 {
		t.Fatalf("replica-a: %+v", rep)
	}
	if err := b.svc.ReleaseLeadership(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rep := reconcile(t, other, cfg); !rep.Leader || rep.Checked != 2 {
		t.Fatalf("replica-b right after the release: %+v", rep)
	}
	if b.gw.Calls(fakegw.OpFind) != 4 {
		t.Fatalf("%d finds for 4 sessions", b.gw.Calls(fakegw.OpFind))
	}
}

// The patrol reconciles when it leads and gives the row back when it stops. Its reconciliation
// is held at the gateway when the shutdown comes.
func TestRunSweeperReconcilesAndReleasesLeadership(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.seedRegistered(t, 2)
	gate := b.gw.Hold(fakegw.OpFind)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, time.Hour); close(done) }()
	mustWait(t, gate.Arrived(), "the patrol's reconciliation")
	if k := b.count(t, `SELECT count(*) FROM maintenance_leaders WHERE owner = 'replica-a' AND until > $1`, t0); k != 1 {
		t.Fatal("the patrol reconciles without holding the leader row")
	}
	cancel()
	mustWait(t, done, "the patrol to stop")
	if k := b.count(t, `SELECT count(*) FROM maintenance_leaders`); k != 0 {
		t.Fatalf("%d leader rows kept after shutdown", k)
	}
	if k := b.count(t, `SELECT failures FROM reconcile_cursors`); k != 0 {
		t.Fatalf("a shutdown counted as %d failures", k)
	}
}

// The patrol's reconciliation compares RECONCILE_BATCH sessions a run (Config.ReconcileBatch),
// not the default 100: a shop whose sessions change faster than 100 a minute raises it so a
// pass still ends. Five sessions, a batch of 3: three gateway searches, the cursor after the
// third session in the scan's order, the pass not over.
func TestPatrolReconcilesItsConfiguredBatch(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.ReconcileBatch = 3 })
	b.seedRegistered(t, 5)
	order := b.sessionsInScanOrder(t)
	b.svc.ReconcileRound(context.Background())
	if n := b.gw.Calls(fakegw.OpFind); n != 3 {
		t.Fatalf("%d sessions searched for at the gateway in one run, want RECONCILE_BATCH's 3", n)
	}
	var after string
	var passes int
	if err := b.pool.QueryRow(context.Background(), `SELECT after_id::text, passes FROM reconcile_cursors`).Scan(&after, &passes); err != nil {
		t.Fatal(err)
	}
	if after != order[2] || passes != 0 {
		t.Fatalf("cursor after %s (pass %d), want after the third session %s in pass 0", after, passes, order[2])
	}
}

// failed is a session the gateway declined, Failed by a Check.
func (b *bench) failed(t *testing.T, orderID string, amount int64) payments.Session {
	t.Helper()
	s := b.registered(t, orderID, amount)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayDeclined)
	if got, err := b.plain.Check(context.Background(), api, s.ID); err != nil || got.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", got.Status, err)
	}
	return s
}

// A late payment whose webhook was lost: the gateway captured money for a Failed session (and
// for a Canceled one). Reconciliation opens one late_payment case each and moves no money;
// running it again opens no second case.
func TestReconcileLatePaymentOnFailedSession(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	dead := b.failed(t, "o-dead", 100)
	canceled := b.registered(t, "o-canceled", 200)
	ch, err := b.plain.RequestCancel(ctx, api, canceled.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := b.plain.ConfirmCancel(ctx, api, canceled.ID, ch.ID, b.lastCode(t, canceled.ID)); err != nil || r.Session.Status != payments.StatusCanceled {
		t.Fatalf("setup cancel: %+v %v", r, err)
	}
	// The money came anyway; no webhook says so.
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded)
	b.gw.SetStatus(canceled.GatewayPaymentID, payments.GatewayAuthorized)

	for run := range 2 {
		rep := reconcile(t, b.svc, payments.ReconcileConfig{})
		if !rep.Leader || rep.Checked != 2 || rep.LatePayments != 2 || rep.Driven != 0 || rep.Duplicates != 0 || rep.Mismatches != 0 || !rep.PassDone {
			t.Fatalf("run %d: %+v", run, rep)
		}
		for _, s := range []payments.Session{dead, canceled} {
			if k := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment' AND resolved_at IS NULL`, s.ID); k != 1 {
				t.Fatalf("run %d: %d late_payment cases for %s", run, k, s.OrderID)
			}
		}
		if k := b.count(t, `SELECT count(*) FROM finance_cases`); k != 2 {
			t.Fatalf("run %d: %d cases in all, want 2", run, k)
		}
		if k := b.count(t, `SELECT count(*) FROM accounting_entries`); k != 0 {
			t.Fatalf("run %d: %d ledger entries", run, k)
		}
		if k := b.count(t, `SELECT count(*) FROM orders WHERE status = 'Paid'`); k != 0 {
			t.Fatalf("run %d: an order became Paid", run)
		}
		if k := b.count(t, `SELECT count(*) FROM payment_sessions WHERE status NOT IN ('Failed', 'Canceled')`); k != 0 {
			t.Fatalf("run %d: a dead session came back to life", run)
		}
	}
	// Each run: the search for other payments under the reference, and the session's own by id.
	if b.gw.Calls(fakegw.OpFind) != 4 || b.gw.Calls(fakegw.OpStatus) != 1+4 {
		t.Fatalf("finds %d (want 2 a run), status %d (the setup's and 2 a run)", b.gw.Calls(fakegw.OpFind), b.gw.Calls(fakegw.OpStatus))
	}
}

// laggingSearch is a gateway whose search index holds an older copy of some payments (Stripe's
// search lags by up to an hour); GET by id is current.
type laggingSearch struct {
	*fakegw.Gateway
	stale map[string]payments.GatewayStatus
}

func (g *laggingSearch) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	ps, err := g.Gateway.FindByReference(ctx, ref)
	for i := range ps {
		if st, ok := g.stale[ps[i].ID]; ok {
			ps[i].Status = st
		}
	}
	return ps, err
}

// Reconciliation judges the session's own payment by its id, never by the search's copy: a
// payment Completed a minute ago, still pending in a lagging index, opened a false
// gateway_mismatch case (an outside review); and a Failed session's payment captured since, still
// declined in the index, was missed.
func TestReconcileJudgesTheOwnPaymentByID(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	lg := &laggingSearch{Gateway: b.gw, stale: map[string]payments.GatewayStatus{}}
	svc := payments.NewService(b.pool, payments.Config{Gateway: lg, Clock: b.clock, ReplicaID: "replica-lag",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	done := b.registered(t, "o-lag-done", 900)
	lg.stale[done.GatewayPaymentID] = payments.GatewayPending
	b.gw.SetStatus(done.GatewayPaymentID, payments.GatewaySucceeded)
	if got, err := svc.Check(ctx, api, done.ID); err != nil || got.Status != payments.StatusCompleted {
		t.Fatalf("check = %s %v", got.Status, err)
	}
	dead := b.registered(t, "o-lag-dead", 700)
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewayDeclined)
	if got, err := svc.Check(ctx, api, dead.ID); err != nil || got.Status != payments.StatusFailed {
		t.Fatalf("check = %s %v", got.Status, err)
	}
	lg.stale[dead.GatewayPaymentID] = payments.GatewayDeclined
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded) // captured late; the index has not seen it
	b.clock.Advance(time.Minute)
	rep := reconcile(t, svc, payments.ReconcileConfig{})
	if rep.Mismatches != 0 || rep.LatePayments != 1 {
		t.Fatalf("report %+v: want no mismatch and the late payment", rep)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, done.ID); n != 0 {
		t.Fatal("a false gateway_mismatch case from the search's stale copy")
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID); n != 1 {
		t.Fatal("the late payment the index had not seen yet was missed")
	}
}

// A gateway that ignored our key took two registrations for one session (the customer paid on
// the second page). Reconciliation opens one duplicate case and changes nothing else.
func TestReconcileDuplicateGatewayPayments(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-dup", 700)
	b.gw.IgnoreKeys(true)
	req := payments.RegisterRequest{IdempotencyKey: s.ID, Reference: s.ID, Amount: s.Amount, Currency: s.Currency}
	second, err := b.gw.Register(ctx, req)
	if err != nil || second.ID == s.GatewayPaymentID {
		t.Fatalf("second registration: %+v %v", second, err)
	}
	b.gw.SetStatus(second.ID, payments.GatewaySucceeded)
	for run := range 2 {
		rep := reconcile(t, b.svc, payments.ReconcileConfig{})
		if rep.Checked != 1 || rep.Duplicates != 1 || rep.LatePayments != 0 || rep.Driven != 0 {
			t.Fatalf("run %d: %+v", run, rep)
		}
		if k := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'duplicate_gateway_payment'`, s.ID); k != 1 {
			t.Fatalf("run %d: %d duplicate cases", run, k)
		}
	}
	got, _ := b.svc.Get(ctx, s.ID)
	if got.Status != payments.StatusRegistered || got.GatewayPaymentID != s.GatewayPaymentID {
		t.Fatalf("session after reconcile: %s %s", got.Status, got.GatewayPaymentID)
	}
	if k := b.count(t, `SELECT count(*) FROM accounting_entries`) + b.count(t, `SELECT count(*) FROM finance_cases WHERE kind <> 'duplicate_gateway_payment'`); k != 0 {
		t.Fatal("reconciling a duplicate wrote money or other cases")
	}
}

// A Completed session whose gateway payment is not succeeded: a gateway_mismatch case, the
// ledger as it was.
func TestReconcileCompletedMismatch(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	s := b.completed(t, "o-done", 900)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayReversed)
	for run := range 2 {
		rep := reconcile(t, b.svc, payments.ReconcileConfig{})
		if rep.Checked != 1 || rep.Mismatches != 1 {
			t.Fatalf("run %d: %+v", run, rep)
		}
	}
	if k := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, s.ID); k != 1 {
		t.Fatalf("%d mismatch cases", k)
	}
	if k := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-done' AND entry_type = 'PaymentReceived'`); k != 1 {
		t.Fatalf("%d PaymentReceived entries, want the one it had", k)
	}
	got, _ := b.svc.Get(context.Background(), s.ID)
	if got.Status != payments.StatusCompleted {
		t.Fatalf("session %s", got.Status)
	}
}

// Active sessions the gateway has settled while every webhook was lost (one even flagged by the
// patrol) are driven through the normal apply path: one Completed with its one ledger entry,
// one Failed; a second run finds nothing to do.
func TestReconcileDrivesSettledActiveSessions(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	paid := b.registered(t, "o-paid", 300)
	declined := b.registered(t, "o-declined", 400)
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'sweep ran out', next_check_at = NULL WHERE id = $1`, paid.ID, t0); err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(paid.GatewayPaymentID, payments.GatewaySucceeded)
	b.gw.SetStatus(declined.GatewayPaymentID, payments.GatewayDeclined)
	b.clock.Advance(time.Minute)

	rep := reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.Checked != 2 || rep.Driven != 2 {
		t.Fatalf("first run: %+v", rep)
	}
	p, _ := b.svc.Get(ctx, paid.ID)
	d, _ := b.svc.Get(ctx, declined.ID)
	if p.Status != payments.StatusCompleted || d.Status != payments.StatusFailed {
		t.Fatalf("after reconcile: paid %s, declined %s", p.Status, d.Status)
	}
	if k := b.count(t, `SELECT count(*) FROM session_events WHERE actor_kind = 'system' AND actor_id = 'reconcile:replica-a'`); k != 2 {
		t.Fatalf("%d timeline events by the reconciler, want 2", k)
	}
	b.clock.Advance(time.Minute)
	rep = reconcile(t, b.svc, payments.ReconcileConfig{})
	if rep.Checked != 2 || rep.Driven != 0 || rep.LatePayments+rep.Mismatches+rep.Duplicates != 0 {
		t.Fatalf("second run: %+v", rep)
	}
	if k := b.count(t, `SELECT count(*) FROM accounting_entries WHERE order_id = 'o-paid' AND entry_type = 'PaymentReceived'`); k != 1 {
		t.Fatalf("%d PaymentReceived entries", k)
	}
	if k := b.count(t, `SELECT count(*) FROM finance_cases`); k != 0 {
		t.Fatalf("%d cases", k)
	}
	checkInvariants(t, b)
}

// Only sessions of this gateway updated within the lookback are compared.
func TestReconcileLookbackAndGateway(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.seedRegistered(t, 3)
	old := fmt.Sprintf("00000000-0000-4000-8000-%012d", 0)
	foreign := fmt.Sprintf("00000000-0000-4000-8000-%012d", 1)
	recent := fmt.Sprintf("00000000-0000-4000-8000-%012d", 2)
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET updated_at = $2 WHERE id = $1`, old, t0.Add(-8*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET gateway = 'stripe' WHERE id = $1`, foreign); err != nil {
		t.Fatal(err)
	}
	rep := reconcile(t, b.svc, payments.ReconcileConfig{Lookback: 7 * 24 * time.Hour})
	if rep.Checked != 1 || b.gw.PaymentCalls(fakegw.OpFind, recent) != 1 || b.gw.Calls(fakegw.OpFind) != 1 {
		t.Fatalf("checked %d; finds: recent %d, old %d, foreign %d", rep.Checked,
			b.gw.PaymentCalls(fakegw.OpFind, recent), b.gw.PaymentCalls(fakegw.OpFind, old), b.gw.PaymentCalls(fakegw.OpFind, foreign))
	}
}

// The gateway failing on a session stops the run without moving the cursor; the next run retries
// the same session. After MaxFailures runs in a row it is skipped until the next pass, so one
// bad session cannot stall reconciliation for ever.
func TestReconcileGatewayErrorsRetryThenSkip(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.seedRegistered(t, 2)
	order := b.sessionsInScanOrder(t)
	cfg := payments.ReconcileConfig{MaxFailures: 3}
	b.gw.Fail(fakegw.OpFind, fakegw.Transient, 3)
	for run := range 3 {
		rep := reconcile(t, b.svc, cfg)
		if rep.Checked != 0 || rep.Errors != 1 || rep.PassDone || rep.Skipped != map[bool]int{false: 0, true: 1}[run == 2] {
			t.Fatalf("failing run %d: %+v", run, rep)
		}
	}
	rep := reconcile(t, b.svc, cfg)
	if rep.Checked != 1 || rep.Errors != 0 || !rep.PassDone {
		t.Fatalf("after the skip: %+v", rep)
	}
	if b.gw.PaymentCalls(fakegw.OpFind, order[0]) != 3 || b.gw.PaymentCalls(fakegw.OpFind, order[1]) != 1 {
		t.Fatalf("finds: first %d (want 3), second %d (want 1)", b.gw.PaymentCalls(fakegw.OpFind, order[0]), b.gw.PaymentCalls(fakegw.OpFind, order[1]))
	}
	if k := b.count(t, `SELECT count(*) FROM gateway_calls WHERE operation = 'find' AND outcome = 'unknown'`); k != 3 {
		t.Fatalf("%d failed finds logged, want 3", k)
	}
}

// A pass that outlives the lookback leaves no sessions between it and the next pass: those
// updated after the previous pass started but before the next window's bottom were compared by
// neither (an outside review: a late payment on a Failed session never got its case). Here the
// lookback is 10 minutes and a pass of one session a run takes 18.
func TestReconcilePassLongerThanTheLookbackLeavesNoGap(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cfg := payments.ReconcileConfig{Lookback: 10 * time.Minute, Batch: 1}
	b.registered(t, "o-a", 100)
	b.registered(t, "o-b", 100)
	b.clock.Advance(time.Minute)
	reconcile(t, b.svc, cfg) // a pass starts: o-a
	b.clock.Advance(time.Minute)
	dead := b.registered(t, "o-gap", 100) // after the pass started: the next pass's
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewayDeclined)
	if s, err := b.plain.Check(ctx, api, dead.ID); err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	b.gw.SetStatus(dead.GatewayPaymentID, payments.GatewaySucceeded) // money came late, no webhook
	for range 3 {                                                    // the pass goes on slowly: o-b, then its end
		b.clock.Advance(6 * time.Minute)
		reconcile(t, b.svc, cfg)
	}
	for range 3 { // the next pass
		b.clock.Advance(time.Minute)
		reconcile(t, b.svc, cfg)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment'`, dead.ID); n != 1 {
		t.Fatalf("late_payment cases for the session between the passes = %d, want 1", n)
	}
}

// blindSearch is a gateway whose search finds nothing yet (its index lags); GET by id answers.
type blindSearch struct{ *fakegw.Gateway }

func (blindSearch) FindByReference(context.Context, string) ([]payments.GatewayPayment, error) {
	return nil, nil
}

// An event that names only the gateway's payment (Stripe's) for a session whose registration
// answer was lost: the payment read by its id carries the session's reference, and that answer
// is applied. Before, the receiver read it, threw it away and ran Check, whose search found
// nothing yet: the event was marked applied with nothing applied (an outside review).
func TestWebhookEventForAnUnattachedSessionAppliesThePaymentReadByID(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	svc := payments.NewService(b.pool, payments.Config{Gateway: blindSearch{b.gw}, Clock: b.clock, ReplicaID: "replica-w",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	r, err := svc.Create(ctx, api, payments.CreateInput{OrderID: "o-wh-lost", Amount: 700, Currency: "EUR"})
	if err == nil && r.Session.GatewayPaymentID != "" {
		t.Fatalf("setup: the registration's answer was not lost: %+v", r.Session)
	}
	b.gw.SetStatus("gp_fake_1", payments.GatewaySucceeded)
	res, err := svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_lost", Type: "payment_intent.succeeded", PaymentID: "gp_fake_1"})
	if err != nil || res.Outcome != payments.EventApplied {
		t.Fatalf("event = %+v %v", res, err)
	}
	got, _ := svc.Get(ctx, r.Session.ID)
	if got.Status != payments.StatusCompleted || got.GatewayPaymentID != "gp_fake_1" {
		t.Fatalf("session %s attached to %q, want Completed through gp_fake_1", got.Status, got.GatewayPaymentID)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, got.ID); n != 1 {
		t.Fatalf("ledger entries = %d", n)
	}
}

// A run is bounded by its leadership (TestAReconcileRunWaitsForASilentDatabaseNoLongerThanItsLeadership),
// and each renewal moves the bound: a run longer than the TTL that renews after every session, as
// the patrol's and the on-demand one do, is not cut. Here three sessions take 2 s each (a
// gateway answering in a second, a find and a status call per session) under a 4-second TTL.
// Negative control: with renewals that do not move the bound, both runs stop at 4 s.
func TestAReconcileRunThatRenewsItsLeadershipOutlastsTheTTL(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.seedRegistered(t, 3)
	b.gw.SetLatency(time.Second)
	cfg := payments.ReconcileConfig{LeaderTTL: 4 * time.Second}
	if rep, err := b.svc.ReconcileOnceWith(t.Context(), cfg); err != nil || rep.Checked != 3 {
		t.Fatalf("the patrol's run: %+v %v; want the three sessions compared", rep, err)
	}
	if rep, err := b.svc.ReconcileSince(t.Context(), time.Hour, cfg); err != nil || rep.Checked != 3 {
		t.Fatalf("the on-demand run: %+v %v; want the three sessions compared", rep, err)
	}
}

// The leadership outlasts a session's gateway calls whatever GATEWAY_TIMEOUT is: with a 3-minute
// timeout the default TTL is 9 minutes, not 5. A run ends with its leadership, and one cut on the
// same slow session (a find and a status call, each up to the timeout) every run would never get
// past it. Negative control: with the fixed 5 minutes, the row is held 5 minutes.
func TestTheReconcileLeadershipOutlastsASessionsGatewayCalls(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	svc := b.service(b.pool, "replica-slow-gateway", func(c *payments.Config) { c.GatewayTimeout = 3 * time.Minute })
	if rep := reconcile(t, svc, payments.ReconcileConfig{}); !rep.Leader {
		t.Fatalf("the run: %+v; want it to lead", rep)
	}
	var held float64
	if err := b.pool.QueryRow(t.Context(), `SELECT extract(epoch FROM until - $1)::float8 FROM maintenance_leaders WHERE owner = 'replica-slow-gateway'`,
		b.clock.Now()).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != (9*time.Minute).Seconds() || svc.ReconcileLeaderTTL() != 9*time.Minute {
		t.Fatalf("the leadership is held %.0f s (said: %s), want three gateway timeouts (540 s)", held, svc.ReconcileLeaderTTL())
	}
}

// A session the run found active but that was settled by someone else while it asked the gateway
// (here a Check of the API between the run's batch read and its status call) is compared, not
// reported as driven: the run moved nothing (the report called it reconciliation's doing, an
// outside review). Negative control: with any status change counted, Driven is 1.
func TestReconcileDoesNotClaimASessionSettledMeanwhile(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	sess := b.registered(t, "o-settled-meanwhile", 300)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	svc := b.service(b.pool, "replica-r", func(c *payments.Config) {
		c.Gateway = &statusAfter{Gateway: b.gw, before: func() {
			if got, err := b.svc.Check(context.Background(), api, sess.ID); err != nil || got.Status != payments.StatusCompleted {
				t.Errorf("the Check meanwhile: %v %v", got.Status, err)
			}
		}}
	})
	rep := reconcile(t, svc, payments.ReconcileConfig{})
	if rep.Checked != 1 || rep.Driven != 0 || len(rep.Findings) != 0 {
		t.Fatalf("the run: %+v; want the session compared and nothing found", rep)
	}
	if k := b.count(t, `SELECT count(*) FROM session_events WHERE actor_id = 'reconcile:replica-r'`); k != 0 {
		t.Fatalf("%d transitions by the reconciler, want none", k)
	}
	// And one it does move is still reported (TestReconcileDrivesSettledActiveSessions).
}
