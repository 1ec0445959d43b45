package payments_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/internal/testlog"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// sweeper is what the lease scenarios drive: the real patrol round, or a naive one kept here as
// the negative control.
type sweeper interface {
	SweepOnce(ctx context.Context) (int, error)
}

// naiveSweeper is the patrol as it was before leases held: a lease is (owner, until) without a
// token, the drive applies through the public Check with no lease guard, and release matches the
// replica NAME. Kept only to show that the lease-lapse test catches exactly that.
type naiveSweeper struct {
	svc   *payments.Service
	pool  *pgxpool.Pool
	name  string
	clock *payments.ManualClock
	lease time.Duration
}

func (n naiveSweeper) SweepOnce(ctx context.Context) (int, error) {
	now := n.clock.Now()
	rows, err := n.pool.Query(ctx, `
		WITH due AS (
			SELECT id AS due_id FROM payment_sessions
			WHERE next_check_at <= $1 AND flagged_at IS NULL AND (lease_until IS NULL OR lease_until <= $1)
			  AND status IN ('Registering','Registered','Unknown','Authorized','Canceling')
			ORDER BY next_check_at LIMIT 100 FOR UPDATE SKIP LOCKED)
		UPDATE payment_sessions ps SET lease_owner = $2, lease_until = $3 FROM due WHERE ps.id = due.due_id
		RETURNING ps.id::text`, now, n.name, now.Add(n.lease))
	if err != nil {
		return 0, err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	for _, id := range ids {
		_, _ = n.svc.Check(ctx, payments.Actor{Kind: payments.ActorSweeper, ID: n.name}, id)
		if _, err := n.pool.Exec(ctx, `UPDATE payment_sessions SET lease_owner = NULL, lease_until = NULL,
			check_attempts = check_attempts + 1, next_check_at = $3 WHERE id = $1 AND lease_owner = $2`,
			id, n.name, n.clock.Now().Add(10*time.Second)); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

// leaseLapse runs the lease-lapse scenario and returns what went wrong (nothing, for a patrol
// whose leases hold):
//
//  1. sweeper A claims the one due session and asks the gateway (authorized); a hook parks A
//     right after the answer, before it applies anything;
//  2. the clock passes A's lease; the customer's payment succeeds at the gateway;
//  3. sweeper B (named takerName) claims the session and asks the gateway (succeeded); a hook
//     parks B there too, so B still holds its lease when A resumes;
//  4. A resumes: it must apply nothing (no Authorized step in the timeline) and release nothing
//     (B's lease stays, so a third sweeper C, half a lease later, finds nothing to claim);
//  5. B resumes and settles the session: Completed, one ledger entry, two gateway calls in all.
func leaseLapse(t *testing.T, takerName string, mk func(b *bench, svc *payments.Service, pool *pgxpool.Pool, name string) sweeper) []string {
	t.Helper()
	const lease = time.Minute
	parkA, parkB := newParker(), newParker()
	hook := func(p *parker) func(c *payments.Config) {
		return func(c *payments.Config) {
			c.LeaseDuration = lease
			c.Hooks.AfterGatewayStatus = func(ctx context.Context, id string, _ payments.GatewayPayment) { p.hook(ctx, id) }
		}
	}
	b := newBench(t)
	gps := b.seedRegistered(t, 1)
	gp := gps[0]
	ctx := context.Background()
	poolA, poolB, poolC := testdb.Pool(t, b.url), testdb.Pool(t, b.url), testdb.Pool(t, b.url)
	svcA := b.service(poolA, "replica-a", hook(parkA))
	svcB := b.service(poolB, takerName, hook(parkB))
	svcC := b.service(poolC, "replica-c", func(c *payments.Config) { c.LeaseDuration = lease })
	A, B, C := mk(b, svcA, poolA, "replica-a"), mk(b, svcB, poolB, takerName), mk(b, svcC, poolC, "replica-c")

	var bad []string
	b.gw.SetStatus(gp, payments.GatewayAuthorized)
	doneA := make(chan int, 1)
	go func() { n, _ := A.SweepOnce(ctx); doneA <- n }()
	mustWait(t, parkA.arrived, "A parked after the gateway's answer")

	b.clock.Advance(lease + time.Second)
	b.gw.SetStatus(gp, payments.GatewaySucceeded)
	doneB := make(chan int, 1)
	go func() { n, _ := B.SweepOnce(ctx); doneB <- n }()
	mustWait(t, parkB.arrived, "B (the taker) parked after the gateway's answer")

	parkA.let(1)
	mustWait(t, doneA, "A's round to end")
	if n := b.count(t, `SELECT count(*) FROM session_events WHERE to_status = 'Authorized'`); n != 0 {
		bad = append(bad, "the parked drive applied its stale answer after losing its lease")
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE lease_until IS NULL`); n != 0 {
		bad = append(bad, "the parked drive released the lease its taker still holds")
	}
	// Within the taker's lease, and past any next look a release would have scheduled.
	b.clock.Advance(lease / 2)
	if n, _ := C.SweepOnce(ctx); n != 0 {
		bad = append(bad, "a third sweeper claimed the session while its taker was still driving it")
	}

	parkB.let(1)
	mustWait(t, doneB, "B's round to end")
	if n := b.gw.PaymentCalls(fakegw.OpStatus, gp); n != 2 {
		bad = append(bad, fmt.Sprintf("the gateway was asked %d times about the payment, want 2 (A once, B once)", n))
	}
	if n := b.gw.Calls(fakegw.OpRegister) - len(gps) + b.gw.Calls(fakegw.OpReverse) + b.gw.Calls(fakegw.OpFind); n != 0 { // seeding registered
		bad = append(bad, fmt.Sprintf("%d other gateway calls", n))
	}
	var status string
	var attempts int
	if err := b.pool.QueryRow(ctx, `SELECT status, check_attempts FROM payment_sessions`).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "Completed" || b.count(t, `SELECT count(*) FROM accounting_entries`) != 1 {
		bad = append(bad, fmt.Sprintf("the taker did not settle the session: %s", status))
	}
	if attempts != 1 {
		bad = append(bad, fmt.Sprintf("check_attempts = %d, want 1 (only the taker's release counts)", attempts))
	}
	checkInvariants(t, b)
	return bad
}

func realSweeper(_ *bench, svc *payments.Service, _ *pgxpool.Pool, _ string) sweeper { return svc }

// A drive parked past its lease: another claim takes the session over and settles it; the parked
// drive, when it resumes, applies and releases nothing and asks the gateway nothing more. The
// taker is another replica, or a process with the same REPLICA_ID (a restarted container keeps
// its host name and pid 1; two workers of one pool share a name).
func TestLeaseLapseParkedDriveAppliesAndReleasesNothing(t *testing.T) {
	t.Parallel()
	for _, taker := range []string{"replica-b", "replica-a"} {
		t.Run("taker="+taker, func(t *testing.T) {
			t.Parallel()
			if bad := leaseLapse(t, taker, realSweeper); len(bad) > 0 {
				t.Fatalf("lease lapse: %v", bad)
			}
		})
	}
}

// Negative control: the same scenario with leases released by replica name (and applied without
// a token guard) lets the parked drive apply a stale answer and free the taker's lease, so a third
// sweeper drives the session while the taker still does.
func TestLeaseLapseNegativeControlReleaseByReplicaName(t *testing.T) {
	t.Parallel()
	naive := func(b *bench, svc *payments.Service, pool *pgxpool.Pool, name string) sweeper {
		return naiveSweeper{svc: svc, pool: pool, name: name, clock: b.clock, lease: time.Minute}
	}
	bad := leaseLapse(t, "replica-a", naive)
	want := map[string]bool{
		"the parked drive applied its stale answer after losing its lease":         false,
		"the parked drive released the lease its taker still holds":                false,
		"a third sweeper claimed the session while its taker was still driving it": false,
	}
	for _, b := range bad {
		if _, ok := want[b]; ok {
			want[b] = true
		}
	}
	for what, seen := range want {
		if !seen {
			t.Errorf("the control should have failed with %q; got %v", what, bad)
		}
	}
}

// barrier lets parties through once all of them arrived (first arrival of each party only).
type barrier struct {
	wg   sync.WaitGroup
	once []sync.Once
}

func newBarrier(parties int) *barrier {
	b := &barrier{once: make([]sync.Once, parties)}
	b.wg.Add(parties)
	return b
}

func (b *barrier) wait(party int) {
	b.once[party].Do(func() {
		b.wg.Done()
		b.wg.Wait()
	})
}

// claimsOf records each party's claims.
type claimsOf struct {
	mu  sync.Mutex
	ids [2][][]string
}

func (c *claimsOf) add(party int, ids []string) {
	c.mu.Lock()
	c.ids[party] = append(c.ids[party], append([]string(nil), ids...))
	c.mu.Unlock()
}

// Two sweepers (two replicas, two pools) on one set of due sessions, held at a sync point right
// after each one's first claim (AfterSweepClaim), so both hold claims and drive at the same time:
// their first claims are disjoint and every session is driven exactly once, counted at the gateway.
func TestTwoSweepersSyncAfterClaimDriveEachSessionOnce(t *testing.T) {
	t.Parallel()
	bar := newBarrier(2)
	var claims claimsOf
	withSync := func(party int) func(c *payments.Config) {
		return func(c *payments.Config) {
			c.SweepConcurrency = 8
			c.Hooks.AfterSweepClaim = func(_ context.Context, ids []string) {
				claims.add(party, ids)
				bar.wait(party)
			}
		}
	}
	b := newBench(t, withSync(0))
	other := b.service(testdb.Pool(t, b.url), "replica-b", withSync(1))
	gps := b.seedRegistered(t, 40)
	counts := make([]int, 2)
	var wg sync.WaitGroup
	for i, svc := range []*payments.Service{b.svc, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := svc.SweepOnce(context.Background())
			if err != nil {
				t.Error(err)
			}
			counts[i] = n
		}()
	}
	wg.Wait()
	first := map[string]int{}
	for party := range 2 {
		if len(claims.ids[party]) == 0 || len(claims.ids[party][0]) == 0 {
			t.Fatalf("sweeper %d never claimed", party)
		}
		for _, id := range claims.ids[party][0] {
			first[id]++
		}
	}
	for id, n := range first {
		if n > 1 {
			t.Fatalf("session %s was in both sweepers' first claims", id)
		}
	}
	if counts[0]+counts[1] != len(gps) {
		t.Fatalf("driven %d + %d, want %d", counts[0], counts[1], len(gps))
	}
	for _, gp := range gps {
		if n := b.gw.PaymentCalls(fakegw.OpStatus, gp); n != 1 {
			t.Fatalf("payment %s asked %d times, want 1", gp, n)
		}
	}
}

// Negative control, concurrent: a claim without row locks (read the due list, then mark it
// leased) run by two sweepers at once, with the same sync point — both read before either marks —
// drives sessions twice.
func TestTwoSweepersWithoutSkipLockedDriveTwice(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	gps := b.seedRegistered(t, 20)
	bar := newBarrier(2)
	naive := func(party int, pool *pgxpool.Pool, svc *payments.Service) error {
		ctx := context.Background()
		rows, err := pool.Query(ctx, `SELECT id::text FROM payment_sessions WHERE next_check_at <= $1
			AND (lease_until IS NULL OR lease_until <= $1) ORDER BY next_check_at LIMIT 8`, b.clock.Now())
		if err != nil {
			return err
		}
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		bar.wait(party)
		if _, err := pool.Exec(ctx, `UPDATE payment_sessions SET lease_owner = $2, lease_until = $3 WHERE id = ANY($1)`,
			ids, fmt.Sprint("naive-", party), b.clock.Now().Add(time.Minute)); err != nil {
			return err
		}
		for _, id := range ids {
			_, _ = svc.Check(ctx, api, id)
		}
		return nil
	}
	pools := []*pgxpool.Pool{b.pool, testdb.Pool(t, b.url)}
	var wg sync.WaitGroup
	for party := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := naive(party, pools[party], b.service(pools[party], fmt.Sprint("naive-", party))); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	twice := 0
	for _, gp := range gps {
		if b.gw.PaymentCalls(fakegw.OpStatus, gp) > 1 {
			twice++
		}
	}
	if twice == 0 {
		t.Fatal("the control expects sessions driven twice without SKIP LOCKED")
	}
	t.Logf("without SKIP LOCKED, %d sessions were driven twice", twice)
}

// 500 due sessions, a gateway that takes 200 ms per call, SWEEP_CONCURRENCY=16: one round settles
// all of them, each asked about exactly once, with up to 16 calls in flight at once and never
// more. (The time it takes is the benchmark's business: internal/bench.)
func TestSweeperDrivesConcurrently(t *testing.T) {
	t.Parallel()
	const total, width = 500, 16
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = width })
	gps := b.seedRegistered(t, total)
	for _, gp := range gps {
		b.gw.SetStatus(gp, payments.GatewaySucceeded)
	}
	b.gw.SetLatency(200 * time.Millisecond)
	n, err := b.svc.SweepOnce(context.Background())
	if err != nil || n != total {
		t.Fatalf("sweep = %d %v, want %d", n, err, total)
	}
	for _, gp := range gps {
		if c := b.gw.PaymentCalls(fakegw.OpStatus, gp); c != 1 {
			t.Fatalf("payment %s asked %d times", gp, c)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE status = 'Completed'`); n != total {
		t.Fatalf("%d of %d settled", n, total)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries`); n != total {
		t.Fatalf("%d ledger entries, want %d", n, total)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE lease_token IS NOT NULL OR lease_owner IS NOT NULL`); n != 0 {
		t.Fatalf("%d leases left", n)
	}
	if m := b.gw.MaxInFlight(); m > width || m < 2 {
		t.Fatalf("at most %d gateway calls were in flight at once; want between 2 and %d", m, width)
	}
	t.Logf("max gateway calls in flight: %d", b.gw.MaxInFlight())
	checkInvariants(t, b)
}

// When the gateway fails for most of a round, the patrol stops claiming and backs off as a whole;
// after the back-off it probes with a few drives (still failing: a longer back-off), and once the
// gateway answers again it drives everything. The heartbeat and the dashboard say so.
func TestPatrolBacksOffWhenGatewayFails(t *testing.T) {
	t.Parallel()
	const total, width = 30, 4
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = width })
	ctx := context.Background()
	b.seedRegistered(t, total)
	b.gw.Outage(true)

	rep, err := b.svc.PatrolRound(ctx)
	if err != nil {
		t.Fatal(err)
	}
	calls := b.gw.Calls(fakegw.OpStatus)
	if calls >= total || calls > payments.BackoffMinCalls+width || !rep.BackingOff {
		t.Fatalf("first round: %d gateway calls of %d due, backing off %v; want it to stop after about %d",
			calls, total, rep.BackingOff, payments.BackoffMinCalls)
	}
	st := b.svc.PatrolStatus()
	if !st.BackingOff || st.BackoffLevel != 1 || st.Reason == "" {
		t.Fatalf("patrol status = %+v", st)
	}
	hb := heartbeatOf(t, b.svc, "replica-a")
	if !hb.BackingOff(b.clock.Now()) || hb.Reason == "" || hb.LastCalls != calls || hb.LastFailed != calls {
		t.Fatalf("heartbeat = %+v", hb)
	}
	d, err := b.svc.Dashboard(ctx)
	if err != nil || len(d.Patrols) != 1 || !d.Patrols[0].BackingOff(d.At) {
		t.Fatalf("dashboard patrols = %+v %v", d.Patrols, err)
	}

	// Backing off: nothing is claimed, however often the patrol runs.
	if rep, _ := b.svc.PatrolRound(ctx); !rep.Skipped || b.gw.Calls(fakegw.OpStatus) != calls {
		t.Fatalf("during the back-off: %+v, calls %d", rep, b.gw.Calls(fakegw.OpStatus))
	}

	// The back-off ends: a probe of a quarter of the width; the gateway is still down.
	b.clock.Advance(payments.PatrolBackoffBase)
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.gw.Calls(fakegw.OpStatus) - calls; got != max(1, width/4) {
		t.Fatalf("the probe made %d calls, want %d", got, max(1, width/4))
	}
	if st := b.svc.PatrolStatus(); !st.BackingOff || st.BackoffLevel != 2 {
		t.Fatalf("after a failed probe: %+v", st)
	}

	// The gateway is back: the probe passes and the round drives everything due.
	b.gw.Outage(false)
	b.clock.Advance(2 * payments.PatrolBackoffBase)
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE next_check_at <= $1`, b.clock.Now()); n != 0 {
		t.Fatalf("%d sessions still due after the gateway came back", n)
	}
	if st := b.svc.PatrolStatus(); st.BackingOff || st.BackoffLevel != 0 {
		t.Fatalf("after recovery: %+v", st)
	}
	if hb := heartbeatOf(t, b.svc, "replica-a"); hb.BackingOff(b.clock.Now()) || hb.BackoffUntil != nil {
		t.Fatalf("heartbeat after recovery = %+v", hb)
	}
}

func heartbeatOf(t *testing.T, svc *payments.Service, replica string) payments.Heartbeat {
	t.Helper()
	hbs, err := svc.Heartbeats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hbs {
		if h.ReplicaID == replica {
			return h
		}
	}
	t.Fatalf("no heartbeat of %s in %+v", replica, hbs)
	return payments.Heartbeat{}
}

// Every round of every replica's patrol writes its heartbeat row: who, which build, how wide,
// when it last swept, what the round did.
func TestPatrolHeartbeatPerReplica(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = 5; c.Version = "v-test" })
	other := b.service(testdb.Pool(t, b.url), "replica-b")
	ctx := context.Background()
	b.seedRegistered(t, 3)
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Second)
	if _, err := other.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	a, o := heartbeatOf(t, b.svc, "replica-a"), heartbeatOf(t, b.svc, "replica-b")
	if a.Version != "v-test" || a.Concurrency != 5 || a.LastDriven != 3 || a.LastCalls != 3 || a.DrivenTotal != 3 ||
		a.InFlight != 0 || a.LastSweepAt == nil || !a.LastSweepAt.Equal(t0) || !a.BeatAt.Equal(t0) {
		t.Fatalf("replica-a heartbeat = %+v", a)
	}
	if o.LastDriven != 0 || !o.BeatAt.Equal(t0.Add(time.Second)) || o.Concurrency != payments.DefaultSweepConcurrency || o.Version == "" {
		t.Fatalf("replica-b heartbeat = %+v", o)
	}
}

// A graceful shutdown: the drive in flight is cut at its gateway call and gives its lease back
// (by its token: a lease another process of the same REPLICA_ID holds stays), and the patrol's
// heartbeat row goes.
func TestSweeperShutdownReleasesOnlyItsOwnLeases(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ids := b.seedRegistered(t, 2)
	ctx := context.Background()
	// The second session is leased by another process that carries the same REPLICA_ID.
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET lease_owner = 'replica-a', lease_until = $1,
		lease_token = gen_random_uuid() WHERE gateway_payment_id = $2`, t0.Add(time.Hour), ids[1]); err != nil {
		t.Fatal(err)
	}
	gate := b.gw.Hold(fakegw.OpStatus)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(rctx, time.Hour); close(done) }()
	mustWait(t, gate.Arrived(), "the drive's gateway call")
	if n := b.count(t, `SELECT count(*) FROM sweeper_heartbeats`); n != 0 {
		t.Fatalf("heartbeat before the first round ended: %d", n)
	}
	cancel()
	mustWait(t, done, "sweeper to stop")
	var owner *string
	if err := b.pool.QueryRow(ctx, `SELECT lease_owner FROM payment_sessions WHERE gateway_payment_id = $1`, ids[0]).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner != nil {
		t.Fatalf("the cut drive kept its lease (%s)", *owner)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE lease_owner = 'replica-a' AND lease_until > $1`, t0); n != 1 {
		t.Fatalf("the other process's lease: %d, want kept", n)
	}
	if n := b.count(t, `SELECT count(*) FROM sweeper_heartbeats`); n != 0 {
		t.Fatalf("%d heartbeat rows after shutdown", n)
	}
}

// The lease and every "may still be in flight" grace derive from GATEWAY_TIMEOUT: a Registering
// session is left to its Create for 2 × timeout + 10 s, and a claim holds for six timeouts.
func TestLeaseAndGraceDeriveFromGatewayTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 3 * time.Second
	b := newBench(t, func(c *payments.Config) { c.GatewayTimeout = timeout })
	ctx := context.Background()

	reg := b.gw.Hold(fakegw.OpRegister)
	created := make(chan error, 1)
	go func() {
		_, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-grace", Amount: 100, Currency: "EUR"})
		created <- err
	}()
	mustWait(t, reg.Arrived(), "the registration in flight")
	var due time.Time
	if err := b.pool.QueryRow(ctx, `SELECT next_check_at FROM payment_sessions WHERE order_id = 'o-grace'`).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(payments.StaleAfterFor(timeout)); !due.Equal(want) || payments.StaleAfterFor(timeout) != 16*time.Second {
		t.Fatalf("a Registering session is due at %s, want %s", due, want)
	}
	reg.Open()
	if err := mustWait(t, created, "the Create"); err != nil {
		t.Fatal(err)
	}

	b.clock.Advance(time.Minute)
	st := b.gw.Hold(fakegw.OpStatus)
	swept := make(chan struct{})
	go func() { _, _ = b.svc.SweepOnce(ctx); close(swept) }()
	mustWait(t, st.Arrived(), "the drive's gateway call")
	var until time.Time
	if err := b.pool.QueryRow(ctx, `SELECT lease_until FROM payment_sessions WHERE lease_token IS NOT NULL`).Scan(&until); err != nil {
		t.Fatal(err)
	}
	if want := b.clock.Now().Add(6 * timeout); !until.Equal(want) || payments.LeaseFor(timeout) != 6*timeout {
		t.Fatalf("lease until %s, want %s (six gateway timeouts)", until, want)
	}
	st.Open()
	mustWait(t, swept, "the round")
}

// Every transaction of the core bounds its lock waits (BEGIN and SET LOCAL lock_timeout go in one
// round trip): a Check that finds the order locked by someone else gives up with EUNAVAIL.
func TestTransactionsBoundLockWaits(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.LockTimeout = 100 * time.Millisecond })
	ctx := context.Background()
	s := b.registered(t, "o-locked", 100)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = 'o-locked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayAuthorized)
	if _, err := b.svc.Check(ctx, api, s.ID); payments.ErrorCode(err) != payments.EUNAVAIL {
		t.Fatalf("Check behind a held order lock = %v, want EUNAVAIL (lock_timeout)", err)
	}
	var lockTimeout string
	if err := b.pool.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lockTimeout); err != nil || lockTimeout != "0" {
		t.Fatalf("lock_timeout leaked out of the transaction onto the pool's session: %q %v", lockTimeout, err)
	}
}

// A graceful shutdown gives the cut drives' sessions back due at once, their schedule untouched
// (the cut look never happened): another replica's next round drives every one of them right
// away, without the clock moving — not after the lease would have run out, nor after the next
// step of the schedule. Before, the release recorded the cut drive as a look (attempts + 1, next
// look Backoff[1] later) and replica-b's round found nothing due.
func TestSweeperShutdownHandsSessionsOverAtOnce(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	const n = 3
	b.seedRegistered(t, n)
	ctx := context.Background()
	gate := b.gw.Hold(fakegw.OpStatus)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(rctx, time.Hour); close(done) }()
	for range n {
		mustWait(t, gate.Arrived(), "the drives' gateway calls")
	}
	cancel()
	mustWait(t, done, "sweeper to stop")
	b.gw.Unhold(fakegw.OpStatus)
	gate.Open()
	if got := b.count(t, `SELECT count(*) FROM payment_sessions WHERE lease_token IS NULL AND next_check_at = $1 AND check_attempts = 0`, t0); got != n {
		t.Fatalf("%d of %d sessions given back due now with their schedule untouched", got, n)
	}
	other := b.service(b.pool, "replica-b")
	driven, err := other.SweepOnce(ctx)
	if err != nil || driven != n {
		t.Fatalf("replica-b's next round drove %d (%v), want all %d at once", driven, err, n)
	}
	if got := b.gw.Calls(fakegw.OpStatus); got != 2*n {
		t.Fatalf("%d status calls, want %d (the cut ones and replica-b's)", got, 2*n)
	}
}

// A drive gives its slot back once its last gateway call is behind it, before its answer is
// written (handOff): while a first wave of answers is still being written (parked inside their
// settle transactions), the patrol sends a second wave of drives to the gateway. Never more than
// SweepConcurrency calls are at the gateway at once, and every session is asked exactly once.
// Before, the slot was held through the write, and the second wave waited for it (the test then
// times out waiting for the second wave).
func TestPatrolDrivesTheNextWaveWhileAnswersAreWritten(t *testing.T) {
	t.Parallel()
	const width = 4
	park := newParker()
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = width; c.Hooks.AfterApplyLock = park.hook })
	for _, id := range b.seedRegistered(t, 3*width) {
		b.gw.SetStatus(id, payments.GatewaySucceeded)
	}
	gate := b.gw.Hold("status")
	swept := make(chan error, 1)
	letGo := sync.OnceFunc(func() {
		gate.Open()
		park.let(1000)
	})
	t.Cleanup(func() { // a failing run lets everything go before the database is dropped
		letGo()
		<-swept
	})
	go func() {
		_, err := b.svc.SweepOnce(context.Background())
		swept <- err
	}()
	leased := func() int { return b.count(t, `SELECT count(*) FROM payment_sessions WHERE lease_token IS NOT NULL`) }
	for range width {
		mustWait(t, gate.Arrived(), "the first wave at the gateway")
	}
	if n := leased(); n != width {
		t.Fatalf("%d sessions leased while %d drives wait at the gateway, want %d (the width)", n, width, width)
	}
	for range width {
		gate.Release()
	}
	// The first wave's answers: two settle transactions park inside (AfterApplyLock), the
	// other answers wait for them. Their slots are free already: the second wave goes out.
	mustWait(t, park.arrived, "the first answer's settle")
	mustWait(t, park.arrived, "the second answer's settle")
	for range width {
		mustWait(t, gate.Arrived(), "the second wave at the gateway while the first wave's answers are written")
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE status = 'Completed'`); n != 0 {
		t.Fatalf("%d sessions completed while every settle is parked", n)
	}
	if n := leased(); n != 2*width {
		t.Fatalf("%d sessions leased, want %d (one wave at the gateway, one being written)", n, 2*width)
	}
	letGo()
	if err := mustWait(t, swept, "the round"); err != nil {
		t.Fatal(err)
	}
	swept <- nil // for the cleanup
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE status = 'Completed'`); n != 3*width {
		t.Fatalf("%d of %d sessions completed", n, 3*width)
	}
	if calls := b.gw.Calls("status"); calls != 3*width {
		t.Fatalf("%d status calls for %d sessions, want one each", calls, 3*width)
	}
	if m := b.gw.MaxInFlight(); m > width {
		t.Fatalf("%d gateway calls at once, more than the width %d", m, width)
	}
}

// A round that drains a backlog is a long one: its heartbeat says it sweeps while it claims, not
// only at its end. Judged at the round's end, a replica draining at full width after an outage
// showed no sweep for minutes and PitlaneReplicaNotSweeping (critical, "restart it") fired (an
// outside review). Its drives count as they finish, once each.
func TestPatrolHeartbeatShowsARoundInProgress(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = 2 })
	ctx := context.Background()
	b.seedRegistered(t, 4)
	gate := b.gw.Hold(fakegw.OpStatus)
	done := make(chan error, 1)
	go func() { _, err := b.svc.PatrolRound(ctx); done <- err }()
	for range 2 {
		mustWait(t, gate.Arrived(), "a drive at the gateway")
	}
	b.svc.BeatNow(ctx)
	if h := heartbeatOf(t, b.svc, "replica-a"); h.LastSweepAt == nil || h.InFlight != 2 {
		t.Fatalf("heartbeat mid-round = %+v, want the sweep it is doing and 2 in flight", h)
	}
	gate.Open()
	if err := mustWait(t, done, "the round"); err != nil {
		t.Fatal(err)
	}
	if h := heartbeatOf(t, b.svc, "replica-a"); h.DrivenTotal != 4 || h.LastDriven != 4 {
		t.Fatalf("heartbeat after the round = %+v, want 4 driven once each", h)
	}
}

// Each heartbeat measures how far the replica's clock is from the database's: leases and
// deadlines are compared with the replicas' clocks, and a replica seconds ahead takes the
// others' leases early. One replica 7 s ahead of the database, one on time.
func TestHeartbeatMeasuresTheReplicasClockOffset(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	ahead := b.service(b.pool, "replica-ahead", func(c *payments.Config) {
		c.Clock = payments.NewManualClock(time.Now().Add(7 * time.Second))
	})
	onTime := b.service(b.pool, "replica-on-time", func(c *payments.Config) { c.Clock = payments.SystemClock{} })
	ahead.BeatNow(ctx)
	onTime.BeatNow(ctx)
	hbs, err := b.svc.Heartbeats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Duration{}
	for _, h := range hbs {
		if h.ClockOffset == nil {
			t.Fatalf("%s: no clock offset measured", h.ReplicaID)
		}
		got[h.ReplicaID] = *h.ClockOffset
	}
	// The measurement is below the truth by the statement's way to the server (milliseconds).
	if d := got["replica-ahead"]; d < 6*time.Second || d > 7*time.Second+100*time.Millisecond {
		t.Errorf("the replica 7 s ahead measured %s", d)
	}
	if d := got["replica-on-time"]; d < -time.Second || d > 100*time.Millisecond {
		t.Errorf("the replica on time measured %s", d)
	}
}

// While the database is unavailable every patrol round fails the same way: the patrol logs the
// first such error at once and then one a minute with how many it left out, not one per round
// (five lines a second at SWEEP_INTERVAL=200ms: an operator's run of a database outage).
func TestPatrolLogsADatabaseOutageOnceAMinute(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	svc := payments.NewService(testdb.Unreachable(t), payments.Config{ReplicaID: "replica-down",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 3 {
		svc.BeatNow(context.Background())
	}
	if n := strings.Count(logs.String(), `msg="patrol: heartbeat`); n != 1 {
		t.Fatalf("three failed heartbeats in an outage logged %d lines, want 1:\n%s", n, logs.String())
	}
}

// A replica whose claims fail every round (the database refuses its statements) has not looked
// for due work: its heartbeat says no sweep, and PitlaneReplicaNotSweeping can fire. The sweep
// was marked before each claim ran, so a replica whose every claim failed while its heartbeat
// went through looked like it swept (an outside review, metrics). Negative control (run by
// hand): with the mark before the claim, LastSweepAt is set after the failing round.
func TestAReplicaWhoseClaimsFailHasNotSwept(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.seedRegistered(t, 1)
	b.clock.Advance(time.Hour)
	if _, err := b.pool.Exec(ctx, `ALTER TABLE payment_sessions RENAME TO payment_sessions_away`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.PatrolRound(ctx); err == nil {
		t.Fatal("setup: the round's claims did not fail")
	}
	b.svc.BeatNow(ctx)
	if h := heartbeatOf(t, b.svc, "replica-a"); h.LastSweepAt != nil {
		t.Fatalf("heartbeat after a round whose claims failed = %+v, want no sweep", h)
	}
	if _, err := b.pool.Exec(ctx, `ALTER TABLE payment_sessions_away RENAME TO payment_sessions`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.PatrolRound(ctx); err != nil {
		t.Fatal(err)
	}
	b.svc.BeatNow(ctx)
	if h := heartbeatOf(t, b.svc, "replica-a"); h.LastSweepAt == nil {
		t.Fatalf("heartbeat after a round that claimed = %+v, want its sweep", h)
	}
}
