package payments_test

// The patrol against a slow gateway: its width, and work falling due while a drive hangs (from
// the patrol review).

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// waitBeatAt waits (no sleep: polls the row) until replica's heartbeat was written at service
// time at or after at. The producer beats at the top of its loop, so a beat at a later time than
// the previous one proves the loop came round again.
func waitBeatAt(t *testing.T, b *bench, replica string, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var beat time.Time
		err := b.pool.QueryRow(context.Background(), `SELECT beat_at FROM sweeper_heartbeats WHERE replica_id = $1`, replica).Scan(&beat)
		if err == nil && !beat.Before(at) {
			return
		}
	}
	t.Fatalf("no heartbeat of %s at %v", replica, at)
}

// "The producer ... claims again as soon as drives finish — never batch by batch" (core.md), and
// a replica stopping hands its rows back due now so that "another replica's next round (within
// SWEEP_INTERVAL) drives them" (operations.md). Here one drive hangs at a slow gateway (a lost
// registration looked up by reference, the look-up not answering); three sessions fall due
// while it hangs, and the pool has three free workers. The producer loops (it beats every
// SWEEP_INTERVAL) but claims nothing: every source was marked exhausted when the round's first
// claim came back short, and a round ends only when its slowest drive does — up to the drive
// budget (five gateway timeouts: 50 s by default). One hung call held all newly due work of
// the replica (first looks, recoveries, cancels handed over by a stopping replica). Now each
// beat (every SWEEP_INTERVAL) clears the marks and the free workers claim what fell due.
// Negative control: without clear(exhausted) on the beat, 0 of 3 asked.
func TestAHungDriveHoldsNewlyDueWorkOfTheReplica(t *testing.T) {
	t.Parallel()
	const width = 4
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = width })
	b.reconcileElsewhere(t)
	gps := b.seedRegistered(t, 3)
	b.exec(t, `UPDATE payment_sessions SET next_check_at = $1`, t0.Add(10*time.Second)) // due in 10 s
	const hung = "11111111-1111-4111-8111-111111111111"
	b.exec(t, `INSERT INTO orders (order_id, active_session_id, created_at, updated_at) VALUES ('o-hung', $1, $2, $2)`, hung, t0)
	b.exec(t, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, next_check_at, created_at, updated_at)
		VALUES ($1, 'o-hung', 100, 'EUR', 'Unknown', 'fake', $2, $2, $2)`, hung, t0)

	find := b.gw.Hold(fakegw.OpFind)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, 10*time.Millisecond); close(done) }()
	mustWait(t, find.Arrived(), "the hung drive's look-up by reference")

	// Three sessions fall due; the producer comes round several times (each beat is a loop).
	// Their status calls are held where they arrive: counted after the beats, a drive started
	// on the last beat had not always reached the gateway yet (a loaded machine).
	status := b.gw.Hold(fakegw.OpStatus)
	defer status.Open()
	b.clock.Advance(10 * time.Second)
	for i := range 5 {
		at := b.clock.Now()
		waitBeatAt(t, b, "replica-a", at)
		b.clock.Advance(time.Duration(i+1) * time.Millisecond)
	}
	waitBeatAt(t, b, "replica-a", b.clock.Now())
	for i := range gps {
		select {
		case <-status.Arrived():
		case <-time.After(20 * time.Second):
			t.Fatalf("while one drive hung at the gateway, %d of %d due sessions were asked about (status calls) "+
				"with the producer looping: newly due work waits for the round's slowest drive", i, len(gps))
		}
	}
	status.Open()
	find.Open()
	cancel()
	mustWait(t, done, "the patrol to stop")
}

// "At most SWEEP_CONCURRENCY drives talk to the gateway at once" (core.md). A drive gives its
// slot back (handOff) before it applies its answer — but applying may ask the gateway again
// (an answer overtaken by a newer decision: staleAnswer). That second question is asked outside
// the pool's width. Width 1: the drive of session X has its answer (authorized); meanwhile a
// request's Check completes X; the drive hands its slot back, the producer starts Y's drive, and
// X's drive asked the gateway again: two gateway calls of one replica's patrol in flight at
// once. Now the second question waits for a slot (retakeSlot; the producer reserves its slots
// before it claims). Negative control: without retakeSlot, the second call arrives at once.
func TestOvertakenAnswersAskTheGatewayBeyondThePatrolsWidth(t *testing.T) {
	t.Parallel()
	park := newParker()
	var xID string
	b := newBench(t, func(c *payments.Config) {
		c.SweepConcurrency = 1
		c.Hooks.AfterGatewayStatus = func(ctx context.Context, id string, _ payments.GatewayPayment) {
			if id == xID {
				park.hook(ctx, id)
			}
		}
	})
	ctx := context.Background()
	gps := b.seedRegistered(t, 2)
	xID = "00000000-0000-4000-8000-000000000000" // seedRegistered's first session
	b.gw.SetStatus(gps[0], payments.GatewayAuthorized)
	swept := make(chan error, 1)
	go func() { _, err := b.svc.SweepOnce(ctx); swept <- err }()
	mustWait(t, park.arrived, "X's drive parked with its answer (authorized)")

	// A request's Check sees the payment captured: X is Completed (its lease ends with it).
	b.gw.SetStatus(gps[0], payments.GatewaySucceeded)
	if s, err := b.plain.Check(ctx, api, xID); err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("request check: %s %v", s.Status, err)
	}
	gate := b.gw.Hold(fakegw.OpStatus)
	park.let(1)
	first := mustWait(t, gate.Arrived(), "a gateway call of the patrol")
	var second string
	select {
	case second = <-gate.Arrived(): // a second call while the first is still unanswered
	case <-time.After(time.Second): // bounded: a patrol within its width sends none while the first waits
	}
	gate.Open()
	if err := <-swept; err != nil {
		t.Fatal(err)
	}
	if second != "" {
		t.Fatalf("a patrol of width 1 had 2 gateway calls in flight at once (%s and %s): X's second question, asked "+
			"after its slot was handed back, beside the drive that took the slot; status calls about X: %d (drive, request, again)",
			first, second, b.gw.PaymentCalls(fakegw.OpStatus, gps[0]))
	}
}

// The same with two replicas, as operations.md promises it ("Stopping a replica"): replica A is
// stopped while its three drives wait at a slow gateway; they are cut and their sessions given
// back due now "so another replica's next round (within SWEEP_INTERVAL) drives them — not six
// gateway timeouts later". Replica B is up and looping, three of its four workers free, but one
// of its drives hangs at the same slow gateway: B asks nothing about the handed-over sessions
// until that drive ended (up to five gateway timeouts). Negative control as the first test's.
func TestAStoppedReplicasSessionsWaitForTheOtherReplicasSlowestDrive(t *testing.T) {
	t.Parallel()
	const width = 4
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = width })
	a := b.service(b.pool, "replica-stopping", func(c *payments.Config) { c.SweepConcurrency = width })
	b.reconcileElsewhere(t)
	gps := b.seedRegistered(t, 3)
	b.exec(t, `UPDATE payment_sessions SET next_check_at = $1`, t0.Add(10*time.Second))
	const hung = "11111111-1111-4111-8111-111111111111"
	b.exec(t, `INSERT INTO orders (order_id, active_session_id, created_at, updated_at) VALUES ('o-hung', $1, $2, $2)`, hung, t0)
	b.exec(t, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, next_check_at, created_at, updated_at)
		VALUES ($1, 'o-hung', 100, 'EUR', 'Unknown', 'fake', $2, $2, $2)`, hung, t0)

	find := b.gw.Hold(fakegw.OpFind)
	status := b.gw.Hold(fakegw.OpStatus)
	bctx, stopB := context.WithCancel(context.Background())
	bDone := make(chan struct{})
	go func() { b.svc.RunSweeper(bctx, 10*time.Millisecond); close(bDone) }()
	mustWait(t, find.Arrived(), "B's drive hung at the gateway")

	b.clock.Advance(10 * time.Second)
	actx, stopA := context.WithCancel(context.Background())
	aDone := make(chan struct{})
	go func() { _, _ = a.SweepOnce(actx); close(aDone) }()
	for range gps {
		mustWait(t, status.Arrived(), "A's drives at the gateway")
	}
	stopA() // SIGTERM: A's drives are cut and their sessions handed back due now
	mustWait(t, aDone, "A's round to end")
	status.Open() // the gateway answers B's status calls at once
	for i := range 5 {
		waitBeatAt(t, b, "replica-a", b.clock.Now())
		b.clock.Advance(time.Duration(i+1) * time.Millisecond)
	}
	waitBeatAt(t, b, "replica-a", b.clock.Now())
	waiting := b.count(t, `SELECT count(*) FROM payment_sessions WHERE status = 'Registered' AND lease_token IS NULL AND next_check_at <= $1`, b.clock.Now())
	calls := 0
	for _, gp := range gps {
		calls += b.gw.PaymentCalls(fakegw.OpStatus, gp)
	}
	find.Open()
	stopB()
	mustWait(t, bDone, "B to stop")
	if waiting != 0 {
		t.Fatalf("replica B, looping with %d free workers, left %d of the %d sessions the stopped replica handed back due now "+
			"unasked (%d status calls in all, A's %d cut ones included): they wait for B's slowest drive (up to 5 gateway "+
			"timeouts), not SWEEP_INTERVAL", width-1, waiting, len(gps), calls, len(gps))
	}
}

// heldNotifier stops each delivery until the test lets that message go (or its drive ends).
type heldNotifier struct {
	arrived chan string
	mu      sync.Mutex
	release map[string]chan struct{}
}

func newHeldNotifier() *heldNotifier {
	return &heldNotifier{arrived: make(chan string, 100), release: map[string]chan struct{}{}}
}

func (n *heldNotifier) gate(to string) chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	ch, ok := n.release[to]
	if !ok {
		ch = make(chan struct{})
		n.release[to] = ch
	}
	return ch
}

func (n *heldNotifier) Notify(ctx context.Context, m payments.Message) error {
	ch := n.gate(m.To)
	n.arrived <- m.To
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (n *heldNotifier) let(to string) { close(n.gate(to)) }

// A round decides once, at its start,
// whether the patrol backs off (gateway sources skipped) — fine while a round ended once its
// sources came back short and its slowest drive ended. Now every beat claims again, so a round
// that began during a back-off lives on as long as some drive is in flight at each beat and
// something falls due: with the notifier slow (a drive lasts longer than SWEEP_INTERVAL) and
// customer messages coming in, the back-off round keeps claiming outbox messages long after the
// back-off ended, and the due payments are never probed ("the first round after a back-off is a
// probe", core.md). Now a beat that finds the back-off over ends the round's claims, and the next
// round probes. From the review of c73277b; negative control: without that case in the beat's
// switch, six more messages and no probe.
func TestABackingOffRoundOutlivesItsBackoffThroughTheOutbox(t *testing.T) {
	t.Parallel()
	n := newHeldNotifier()
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = 4; c.Notifier = n })
	b.reconcileElsewhere(t)
	b.seedRegistered(t, 30)
	b.gw.Outage(true)
	if rep, err := b.svc.PatrolRound(context.Background()); err != nil || !rep.BackingOff {
		t.Fatalf("first round: %+v %v", rep, err)
	}
	b.gw.Outage(false)
	b.exec(t, `UPDATE payment_sessions SET next_check_at = $1 WHERE `+"status = 'Registered'", b.clock.Now())
	probe := b.gw.Hold(fakegw.OpStatus) // any status call after this is the gateway being probed

	message := func(k int) string {
		to := fmt.Sprintf("customer-%d@example.com", k)
		b.exec(t, `INSERT INTO outbox (kind, to_addr, body, created_at, next_attempt_at) VALUES ('notice', $1, 'hello', $2, $2)`,
			to, b.clock.Now())
		return to
	}
	held := message(0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, 10*time.Millisecond); close(done) }()
	defer func() {
		cancel()
		b.gw.Unhold(fakegw.OpStatus)
		probe.Open()
		<-done
	}()
	if got := mustWait(t, n.arrived, "the backing-off round's outbox drive"); got != held {
		t.Fatalf("first delivery %s, want %s", got, held)
	}

	// The back-off is over. A customer message falls due at each step; the slow notifier lets the
	// previous one go after two more beats (SWEEP_INTERVAL each).
	b.clock.Advance(payments.PatrolBackoffBase + time.Second)
	const steps = 6
	for k := 1; k <= steps; k++ {
		next := message(k)
		for range 2 {
			b.clock.Advance(time.Millisecond)
			waitBeatAt(t, b, "replica-a", b.clock.Now())
		}
		n.let(held) // the slow delivery ends
		select {
		case <-probe.Arrived():
			return // the next round probes the gateway, as promised
		case got := <-n.arrived:
			if got != next {
				t.Fatalf("delivery %s, want %s", got, next)
			}
			held = next
		case <-time.After(20 * time.Second):
			t.Fatalf("step %d: neither a probe of the gateway nor the next delivery", k)
		}
	}
	st := b.svc.PatrolStatus()
	t.Fatalf("the back-off ended %v ago, and the round begun during it claimed %d more outbox messages (one every beat) "+
		"but no due payment: 0 status calls to the gateway with %d sessions due; in flight %d. "+
		"The round started while backing off never ends while a slow notifier has a drive in flight at each beat",
		b.clock.Now().Sub(st.BackoffUntil), steps, b.count(t, `SELECT count(*) FROM payment_sessions WHERE status = 'Registered' AND next_check_at <= $1`, b.clock.Now()),
		st.InFlight)
}

// "Round-robin over the three sources", and "a source whose claim came back short is not claimed
// from again until the next beat" (core.md). The beat re-armed a short source only within one
// drive budget of the round's start, so that a round fed every beat still ends. But a round fed
// by another source's backlog does not end either (a drain after an outage is one round): past
// that budget a source short once was never claimed again while the backlog lasted. Here a
// payment falls due past the budget while a thousand Pending refunds drain two at a time, and it
// got its first look only after the last refund. Now a beat past the budget re-arms the short
// sources too while another source is still claimed from. From an outside review; negative
// control: with the beat's case back to `time.Since(roundStarted) < s.driveBudget()`, the look
// comes with 0 refunds pending. The same payment falling due within the budget is the control
// (it passed before).
func TestARefundBacklogDoesNotStarveDueSessionsPastTheDriveBudget(t *testing.T) {
	t.Parallel()
	refundBacklogWithADueSession(t, true)
}

// The control: the payment falls due within the round's first drive budget.
func TestARefundBacklogLetsADueSessionInWithinTheDriveBudget(t *testing.T) {
	t.Parallel()
	refundBacklogWithADueSession(t, false)
}

func refundBacklogWithADueSession(t *testing.T, pastBudget bool) {
	const refunds = 1000
	// The drive budget is 5 timeouts of wall time: 2 s past which the payment falls due, or, for
	// the control, 20 s, which the whole drain (≥ 5 s) stays within however slow the machine.
	timeout := 400 * time.Millisecond
	if !pastBudget {
		timeout = 4 * time.Second
	}
	b := newBench(t, func(c *payments.Config) {
		c.SweepConcurrency = 2
		c.GatewayTimeout = timeout
	})
	b.reconcileElsewhere(t)
	ctx := context.Background()
	paid := b.completed(t, "o-refunded", 1_000_000)
	late := b.registered(t, "o-due-later", 100) // its first look is 5 s away on the service clock
	b.exec(t, `INSERT INTO refunds (id, session_id, order_id, amount, currency, status, request_key, next_check_at, created_at, updated_at)
		SELECT gen_random_uuid(), $1, $2, 1, 'EUR', 'Pending', 'k-' || g, $3, $3, $3 FROM generate_series(1, $4) g`,
		paid.ID, paid.OrderID, b.clock.Now(), refunds)
	b.gw.SetLatency(10 * time.Millisecond) // 2 at a time: the drain takes ≥ 5 s
	budget := payments.LeaseFor(timeout) - timeout

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	started := time.Now()
	go func() { b.svc.RunSweeper(rctx, 10*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()
	// Waits on the drain itself (the refund calls), not on time; past the budget, on the wall
	// clock the budget is measured on.
	for b.gw.Calls(fakegw.OpRefund) < 4 || (pastBudget && time.Since(started) < budget+300*time.Millisecond) {
	}
	if !pastBudget && time.Since(started) >= budget {
		t.Fatalf("the control's premise failed: the drain's fourth call came %v into the round, past its drive budget %v", time.Since(started), budget)
	}
	gate := b.gw.Hold(fakegw.OpStatus)
	b.exec(t, `UPDATE payment_sessions SET next_check_at = $2 WHERE id = $1`, late.ID, b.clock.Now())
	pendingAtDue := b.count(t, `SELECT count(*) FROM refunds WHERE status = 'Pending'`)
	dueAfter := time.Since(started)
	mustWait(t, gate.Arrived(), "the due payment's first look")
	pendingAtLook := b.count(t, `SELECT count(*) FROM refunds WHERE status = 'Pending'`)
	lookAfter := time.Since(started)
	b.gw.Unhold(fakegw.OpStatus)
	gate.Open()
	t.Logf("payment due %v into the round (budget %v) with %d refunds pending; first looked at %v into it with %d pending",
		dueAfter.Round(time.Millisecond), budget, pendingAtDue, lookAfter.Round(time.Millisecond), pendingAtLook)
	if pendingAtLook == 0 && pendingAtDue > 50 {
		t.Errorf("a payment fell due %v into the round with %d refunds still Pending and was first looked at only "+
			"after the last of them, %v later: the session source, short once, was not claimed again for the rest of the round",
			dueAfter.Round(time.Millisecond), pendingAtDue, (lookAfter - dueAfter).Round(time.Millisecond))
	}
}
