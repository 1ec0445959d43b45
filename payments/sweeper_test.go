package payments_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// seedRegistered puts n due Registered sessions straight into the database, each with its own
// payment at the fake gateway, and returns the gateway payment ids.
func (b *bench) seedRegistered(t testing.TB, n int) []string {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, n)
	batch := make([][]any, 0, n)
	for i := range n {
		ref := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		gp, err := b.gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: ref, Reference: ref, Amount: 100, Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = gp.ID
		batch = append(batch, []any{ref, fmt.Sprintf("bulk-%d", i), gp.ID})
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, r := range batch {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id, active_session_id, created_at, updated_at) VALUES ($2, $1, $3, $3)`,
			r[0], r[1], t0); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, gateway_payment_id, next_check_at, created_at, updated_at)
			VALUES ($1, $2, 100, 'EUR', 'Registered', 'fake', $3, $4, $4, $4)`, r[0], r[1], r[2], t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// Two sweepers (two replicas, two pools) over 1000 due sessions (10000 in make polygon): every
// session is driven exactly once in the round — one gateway status call each — and the two split
// the work.
func TestTwoSweepersDriveEachSessionOnce(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = 16 })
	other := b.service(testdb.Pool(t, b.url), "replica-b", func(c *payments.Config) { c.SweepConcurrency = 16 })
	total := scale(1000, 10000)
	ids := b.seedRegistered(t, total)

	var wg sync.WaitGroup
	counts := make([]int, 2)
	errs := make([]error, 2)
	start := make(chan struct{})
	for i, svc := range []*payments.Service{b.svc, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			counts[i], errs[i] = svc.SweepOnce(context.Background())
		}()
	}
	close(start)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("sweep errors: %v %v", errs[0], errs[1])
	}
	if counts[0]+counts[1] != total {
		t.Fatalf("driven %d + %d, want %d", counts[0], counts[1], total)
	}
	for _, id := range ids {
		if n := b.gw.PaymentCalls(fakegw.OpStatus, id); n != 1 {
			t.Fatalf("payment %s asked %d times, want 1", id, n)
		}
	}
	t.Logf("replica-a drove %d, replica-b drove %d", counts[0], counts[1])
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE lease_owner IS NOT NULL`); n != 0 {
		t.Fatalf("%d leases left behind", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE next_check_at <= $1`, t0); n != 0 {
		t.Fatalf("%d sessions still due after the round", n)
	}
}

// The negative control for the claim: without SKIP LOCKED and leases (every replica reads the due
// list and drives it), two sweepers ask the gateway twice about the same sessions.
func TestNaiveSweepersDriveTwice(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ids := b.seedRegistered(t, 20)
	naive := func() {
		rows, err := b.pool.Query(context.Background(), `SELECT id::text FROM payment_sessions WHERE next_check_at <= $1`, t0)
		if err != nil {
			t.Error(err)
			return
		}
		var due []string
		for rows.Next() {
			var id string
			_ = rows.Scan(&id)
			due = append(due, id)
		}
		rows.Close()
		for _, id := range due {
			_, _ = b.svc.Check(context.Background(), api, id)
		}
	}
	naive()
	naive() // the second replica read the same list before the first rescheduled anything
	twice := 0
	for _, id := range ids {
		if b.gw.PaymentCalls(fakegw.OpStatus, id) > 1 {
			twice++
		}
	}
	if twice != len(ids) {
		t.Fatalf("naive sweepers asked twice about %d of %d sessions; the control expects all", twice, len(ids))
	}
}

// A lease left by a dead replica is not taken before it expires and is taken after.
func TestSweeperRespectsLeasesUntilExpiry(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.LeaseDuration = time.Minute })
	ids := b.seedRegistered(t, 1)
	ctx := context.Background()
	// "replica-dead" claimed the session and died before driving it.
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET lease_owner = 'replica-dead', lease_until = $1`, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if n, err := b.svc.SweepOnce(ctx); err != nil || n != 0 {
		t.Fatalf("sweep with a live lease = %d %v", n, err)
	}
	b.clock.Advance(59 * time.Second)
	if n, _ := b.svc.SweepOnce(ctx); n != 0 {
		t.Fatal("took a lease before expiry")
	}
	b.clock.Advance(time.Second)
	if n, err := b.svc.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("sweep after expiry = %d %v", n, err)
	}
	if b.gw.PaymentCalls(fakegw.OpStatus, ids[0]) != 1 {
		t.Fatal("want one status call after takeover")
	}
}

// Time alone never fails a payment: when the schedule runs out the session is flagged for
// finance with the reason, still in its state.
func TestSweeperFlagsWhenScheduleRunsOut(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.Backoff = []time.Duration{time.Second, time.Second, time.Second} })
	b.seedRegistered(t, 1)
	ctx := context.Background()
	for range 5 {
		if _, err := b.svc.SweepOnce(ctx); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(time.Second)
	}
	var status, reason string
	var flagged bool
	if err := b.pool.QueryRow(ctx, `SELECT status, flagged_at IS NOT NULL, coalesce(flag_reason, '') FROM payment_sessions`).Scan(&status, &flagged, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "Registered" || !flagged || reason == "" {
		t.Fatalf("after schedule: %s flagged=%v reason=%q", status, flagged, reason)
	}
	if b.count(t, `SELECT count(*) FROM finance_cases WHERE kind = 'sweep_exhausted'`) != 1 {
		t.Fatal("want a sweep_exhausted case")
	}
	if b.gw.Calls(fakegw.OpStatus) != 3 {
		t.Fatalf("status calls = %d, want 3 (one per step)", b.gw.Calls(fakegw.OpStatus))
	}
}

// A Registering session whose Create died before the gateway answered: the sweeper looks it up
// by reference and attaches it (found), or registers it with the same key (not found).
func TestSweeperRecoversRegistering(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	// Create dies between claim and register: simulate with NotSent (nothing reached the gateway).
	b.gw.Fail(fakegw.OpRegister, fakegw.NotSent, 1)
	r, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-rec", Amount: 100, Currency: "EUR"})
	if err != nil || r.Session.Status != payments.StatusRegistering {
		t.Fatalf("setup: %s %v", r.Session.Status, err)
	}
	b.clock.Advance(time.Minute)
	if n, err := b.svc.SweepOnce(ctx); err != nil || n != 1 {
		t.Fatalf("sweep = %d %v", n, err)
	}
	s, _ := b.svc.Get(ctx, r.Session.ID)
	if s.Status != payments.StatusRegistered || b.gw.PaymentsWithReference(s.ID) != 1 {
		t.Fatalf("after sweep: %s, gateway payments %d", s.Status, b.gw.PaymentsWithReference(s.ID))
	}
	if b.gw.KeyCalls(fakegw.OpRegister, s.ID) != 2 || b.gw.Calls(fakegw.OpFind) != 1 {
		t.Fatal("want a lookup by reference, then a register with the same key")
	}
}

// With a gateway that ignores idempotency keys and a lost registration answer, the sweeper looks
// the payment up by reference before sending anything: still one gateway payment.
func TestSweeperKeysIgnoredLostAnswerOnePayment(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	r, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-ik", Amount: 100, Currency: "EUR"})
	if err != nil || r.Session.Status != payments.StatusUnknown {
		t.Fatalf("setup: %s %v", r.Session.Status, err)
	}
	b.clock.Advance(time.Minute)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	s, _ := b.svc.Get(ctx, r.Session.ID)
	if s.Status != payments.StatusRegistered || b.gw.PaymentsWithReference(s.ID) != 1 || b.gw.Calls(fakegw.OpRegister) != 1 {
		t.Fatalf("status %s, gateway payments %d, registers %d", s.Status, b.gw.PaymentsWithReference(s.ID), b.gw.Calls(fakegw.OpRegister))
	}
}

// A run with lost answers, timeouts and customers doing whatever they do; the sweeper drives
// every session to a final state or a flag, and the invariants hold.
func TestChaosRunInvariantsHold(t *testing.T) {
	t.Parallel()
	orders := scale(40, 1000)
	b := newBench(t, func(c *payments.Config) { c.SweepConcurrency = 7 })
	other := b.service(testdb.Pool(t, b.url), "replica-b", func(c *payments.Config) { c.SweepConcurrency = 7 })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(42, 7))
	var sessions []payments.Session
	for i := range orders {
		if f := rng.IntN(5); f < 3 {
			b.gw.Fail(fakegw.OpRegister, []fakegw.Fault{fakegw.LostAnswer, fakegw.Transient, fakegw.NotSent}[f], 1)
		}
		svc := b.svc
		if i%2 == 1 {
			svc = other
		}
		r, err := svc.Create(ctx, api, payments.CreateInput{OrderID: fmt.Sprintf("chaos-%d", i), Amount: int64(100 + i), Currency: "EUR", CustomerContact: "c@example.com"})
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, r.Session)
	}
	// Customers act at the gateway; some sessions get a cancel with a code.
	for i, s := range sessions {
		ref := s.ID
		switch rng.IntN(5) {
		case 0:
			b.gw.SetStatusByReference(ref, payments.GatewaySucceeded)
		case 1:
			b.gw.SetStatusByReference(ref, payments.GatewayDeclined)
		case 2:
			b.gw.SetStatusByReference(ref, payments.GatewayAuthorized)
		}
		if i%6 == 0 {
			if ch, err := b.svc.RequestCancel(ctx, api, s.ID); err == nil {
				b.gw.Fail(fakegw.OpReverse, fakegw.Transient, rng.IntN(2))
				_, _ = b.svc.ConfirmCancel(ctx, api, s.ID, ch.ID, b.lastCode(t, s.ID))
			}
		}
	}
	// Rounds of the patrol on two replicas, with faults, while time passes; at some point every
	// payment at the gateway reaches a final state.
	for round := range 40 {
		if round%3 == 0 {
			b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 2)
		}
		if round == 10 {
			for _, s := range sessions {
				if rng.IntN(2) == 0 {
					b.gw.SetStatusByReference(s.ID, payments.GatewaySucceeded)
				} else {
					b.gw.SetStatusByReference(s.ID, payments.GatewayExpired)
				}
			}
		}
		b.clock.Advance(2 * time.Hour)
		var wg sync.WaitGroup
		for _, svc := range []*payments.Service{b.svc, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := svc.SweepOnce(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	checkInvariants(t, b)
	rows, err := b.pool.Query(ctx, `SELECT status || coalesce('/flagged' || (flagged_at IS NOT NULL)::text, ''), count(*) FROM payment_sessions GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var st string
		var n int
		_ = rows.Scan(&st, &n)
		t.Logf("final: %-30s %d", st, n)
	}
	rows.Close()
	t.Logf("cases: %d, gateway calls: register %d, status %d, find %d, reverse %d", b.count(t, `SELECT count(*) FROM finance_cases`),
		b.gw.Calls(fakegw.OpRegister), b.gw.Calls(fakegw.OpStatus), b.gw.Calls(fakegw.OpFind), b.gw.Calls(fakegw.OpReverse))
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE status = ANY($1) AND flagged_at IS NULL`,
		[]string{"Registering", "Registered", "Unknown", "Authorized", "Canceling"}); n != 0 {
		t.Fatalf("%d sessions neither final nor flagged", n)
	}
	for _, s := range sessions {
		if n := b.gw.PaymentsWithReference(s.ID); n > 1 {
			t.Fatalf("session %s has %d gateway payments", s.ID, n)
		}
	}
}

// checkInvariants asserts what must hold after any run.
func checkInvariants(t *testing.T, b *bench) {
	t.Helper()
	checks := map[string]string{
		"more than one active session per order": `SELECT count(*) FROM (SELECT order_id FROM payment_sessions
			WHERE status IN ('Registering','Registered','Unknown','Authorized','Canceling') GROUP BY order_id HAVING count(*) > 1) x`,
		"more than one PaymentReceived per order": `SELECT count(*) FROM (SELECT order_id FROM accounting_entries
			WHERE entry_type = 'PaymentReceived' GROUP BY order_id HAVING count(*) > 1) x`,
		"a Completed session without exactly one ledger entry": `SELECT count(*) FROM payment_sessions s WHERE status = 'Completed'
			AND (SELECT count(*) FROM accounting_entries a WHERE a.session_id = s.id AND entry_type = 'PaymentReceived') <> 1`,
		"a ledger entry for a session that is not Completed": `SELECT count(*) FROM accounting_entries a JOIN payment_sessions s ON s.id = a.session_id
			WHERE a.entry_type = 'PaymentReceived' AND s.status <> 'Completed'`,
		"a Paid order whose paid session is not Completed": `SELECT count(*) FROM orders o LEFT JOIN payment_sessions s ON s.id = o.paid_session_id
			WHERE o.status = 'Paid' AND (s.status IS DISTINCT FROM 'Completed')`,
		"more than one reverse operation per session": `SELECT count(*) FROM (SELECT session_id FROM reverse_operations GROUP BY session_id HAVING count(*) > 1) x`,
		"a Canceled session without a reverse operation": `SELECT count(*) FROM payment_sessions s WHERE status = 'Canceled'
			AND NOT EXISTS (SELECT 1 FROM reverse_operations r WHERE r.session_id = s.id)`,
	}
	for what, sql := range checks {
		if n := b.count(t, sql); n != 0 {
			t.Errorf("invariant broken: %s (%d)", what, n)
		}
	}
	rows, err := b.pool.Query(context.Background(), `SELECT r.id::text, coalesce(s.gateway_payment_id, '') FROM reverse_operations r JOIN payment_sessions s ON s.id = r.session_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var op, gp string
		_ = rows.Scan(&op, &gp)
		if gp != "" && b.gw.PaymentCalls(fakegw.OpReverse, gp) > 0 && b.gw.KeyCalls(fakegw.OpReverse, op) != b.gw.PaymentCalls(fakegw.OpReverse, gp) {
			t.Errorf("payment %s was reversed with a key other than its operation's", gp)
		}
	}
}

// reconcileElsewhere makes another replica the reconciliation's leader for a day, so that a
// RunSweeper of the bench only patrols: reconciliation runs on a loop of its own (it reads each
// session's payment by id), and its gateway calls would otherwise mingle with the patrol's that
// a test counts or waits for.
func (b *bench) reconcileElsewhere(t *testing.T) {
	t.Helper()
	b.exec(t, `INSERT INTO maintenance_leaders (job, owner, elected_at, until) VALUES ('reconcile:' || $1, 'replica-elsewhere', $2, $3)`,
		b.gw.Name(), t0, t0.Add(24*time.Hour))
}

// Reconciliation runs beside the patrol, not inside its loop: a batch is a search and a read per
// session, one after another, and inline it held the leader's patrol for as long (an outside
// review saw due sessions wait 90 s behind a slow gateway's searches). Here reconciliation is
// held at its first search while sessions fall due; the patrol still drives them. (Inline, the
// loop never reached another round: the status call below never came.)
func TestReconciliationDoesNotHoldThePatrol(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.seedRegistered(t, 2)
	b.exec(t, `UPDATE payment_sessions SET next_check_at = $1`, t0.Add(time.Hour)) // not due yet
	find := b.gw.Hold(fakegw.OpFind)
	status := b.gw.Hold(fakegw.OpStatus)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.svc.RunSweeper(ctx, 10*time.Millisecond); close(done) }()
	mustWait(t, find.Arrived(), "reconciliation's first search")
	b.clock.Advance(2 * time.Hour) // the sessions fall due
	mustWait(t, status.Arrived(), "the patrol driving a due session while reconciliation waits")
	cancel()
	find.Open()
	status.Open()
	mustWait(t, done, "the sweeper to stop")
}

// unregistered creates a payment whose registration got a 5xx: Unknown, nothing at the gateway,
// no gateway id.
func (b *bench) unregistered(t *testing.T, orderID string, amount int64) payments.Session {
	t.Helper()
	b.gw.Fail(fakegw.OpRegister, fakegw.Transient, 1)
	r, err := b.plain.Create(context.Background(), api, payments.CreateInput{OrderID: orderID, Amount: amount, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil || r.Session.Status != payments.StatusUnknown || r.Session.GatewayPaymentID != "" {
		t.Fatalf("setup: %+v %v, want Unknown with no gateway payment", r.Session, err)
	}
	return r.Session
}

// An Unknown session with nothing at the gateway (Create's registration got a 5xx) that the
// patrol registers again and the gateway refuses outright (a 400: the request itself) is Failed
// at once, as the first refusal would have made it, and the order is free for another payment.
// Before, the refusal was logged and the session stayed Unknown for the whole schedule (about
// three days), the order blocked behind a payment that never existed.
func TestSweeperFailsAnUnknownRegistrationTheGatewayRefuses(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	unknown := b.unregistered(t, "o-refused-again", 100)
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1)
	b.clock.Advance(time.Minute)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := b.svc.Get(ctx, unknown.ID)
	if err != nil || s.Status != payments.StatusFailed || s.LeaseOwner != "" || s.NextCheckAt != nil || s.CheckAttempts != 1 {
		t.Fatalf("after the refusal: %+v %v", s, err)
	}
	if b.gw.Calls(fakegw.OpFind) != 1 || b.gw.PaymentsWithReference(s.ID) != 0 {
		t.Fatal("want one search by reference (nothing found), then the refused registration")
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases`); n != 0 {
		t.Fatalf("%d finance cases for a payment that never existed", n)
	}
	again, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-refused-again", Amount: 90, Currency: "EUR"})
	if err != nil || again.Session.ID == s.ID || again.Session.Status != payments.StatusRegistered {
		t.Fatalf("a new payment of the order: %+v %v", again.Session, err)
	}
}

// A drive ends one gateway timeout before its lease does, and the lease runs from the claim's
// time, not from the drive's start: a claim the database answered late (a busy pool, a
// pooler's queue) has less of its lease left. Here the clock moves on between the claim and the
// drive (AfterSweepClaim). With 15 s of the lease left (more than a gateway timeout) the drive
// asks the gateway; with 5 s left it sends nothing, so it can never be in flight beside the
// row's next holder, and the session goes back due at once with its schedule untouched.
// Negative control: the drive's budget counted from its own start (the main before this change)
// asks the gateway in both cases.
func TestSweeperDriveBudgetRunsFromTheClaim(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		late  time.Duration
		calls int
	}{{45 * time.Second, 1}, {55 * time.Second, 0}} {
		t.Run(tc.late.String(), func(t *testing.T) {
			t.Parallel()
			var b *bench
			var once sync.Once
			b = newBench(t, func(c *payments.Config) {
				c.LeaseDuration, c.GatewayTimeout = time.Minute, 10*time.Second
				c.Hooks.AfterSweepClaim = func(context.Context, []string) { once.Do(func() { b.clock.Advance(tc.late) }) }
			})
			ids := b.seedRegistered(t, 1)
			if _, err := b.svc.SweepOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			if n := b.gw.PaymentCalls(fakegw.OpStatus, ids[0]); n != tc.calls {
				t.Fatalf("the claim %s late: %d status calls, want %d", tc.late, n, tc.calls)
			}
			var attempts int
			var leased, due bool
			if err := b.pool.QueryRow(context.Background(), `SELECT check_attempts, lease_token IS NOT NULL, next_check_at <= $1
				FROM payment_sessions`, t0.Add(tc.late)).Scan(&attempts, &leased, &due); err != nil {
				t.Fatal(err)
			}
			if leased || attempts != tc.calls || due != (tc.calls == 0) {
				t.Fatalf("after the round: attempts %d, leased %v, due now %v", attempts, leased, due)
			}
		})
	}
}
