package payments_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

type createOut struct {
	res payments.CreateResult
	err error
}

func goCreate(svc *payments.Service, in payments.CreateInput) <-chan createOut {
	ch := make(chan createOut, 1)
	go func() {
		res, err := svc.Create(context.Background(), api, in)
		ch <- createOut{res, err}
	}()
	return ch
}

// Two Creates with the same parameters, the first parked right after its read with the advisory
// lock held: the second must wait on the lock (seen in pg_locks), then read the first's session
// and return it, without a claim of its own. One session, one gateway registration.
func TestCreateTwoClicksOneRegistration(t *testing.T) {
	t.Parallel()
	p := newParker()
	b := newBench(t, func(c *payments.Config) { c.Hooks.AfterClaimRead = p.hook })
	in := payments.CreateInput{OrderID: "order-1", Amount: 1999, Currency: "EUR"}

	first := goCreate(b.svc, in)
	mustWait(t, p.arrived, "first create to read")
	second := goCreate(b.svc, in)
	waitLockWaiters(t, b.pool, 1) // the second is blocked on the order's advisory lock (shared)
	p.let(1)
	// The first commits its claim; the second gets the shared lock and reads the committed
	// session (TestCreateDuplicatesWaitForTheOpenClaimTogether).
	r1 := mustWait(t, first, "first create")
	r2 := mustWait(t, second, "second create")

	if r1.err != nil || r2.err != nil {
		t.Fatalf("errors: %v, %v", r1.err, r2.err)
	}
	if !r1.res.Created || r2.res.Created {
		t.Fatalf("created flags = %v, %v; want true, false", r1.res.Created, r2.res.Created)
	}
	if r1.res.Session.ID != r2.res.Session.ID {
		t.Fatalf("two sessions: %s and %s", r1.res.Session.ID, r2.res.Session.ID)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 1 {
		t.Fatalf("sessions = %d, want 1", n)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("gateway registrations = %d, want 1", n)
	}
	if got := r1.res.Session.Status; got != payments.StatusRegistered {
		t.Fatalf("first status = %s, want Registered", got)
	}
}

// A storm of duplicates arriving while the first Create is inside its claim (the duplicate storm
// of make bench): they all wait for that claim at once, on the order's advisory lock taken
// SHARED, and then each reads the committed session. None takes a claim of its own, so they do
// not file through the exclusive lock one claim transaction after another (what made the storm's
// p99 in make bench depend on how many arrived in the first claim's few milliseconds).
// Negative control: with the duplicates going straight to the claim (the code before), the 20
// wait in ExclusiveLock mode and the claim hook sees 21 claims.
func TestCreateDuplicatesWaitForTheOpenClaimTogether(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	claims := 0
	p := newParker()
	b := newBench(t)
	const dups = 20
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = dups + 2 // every duplicate waits on a connection of its own
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc := b.service(pool, "storm", func(c *payments.Config) {
		c.Hooks.AfterClaimRead = func(ctx context.Context, id string) {
			mu.Lock()
			claims++
			mu.Unlock()
			p.hook(ctx, id)
		}
	})
	in := payments.CreateInput{OrderID: "storm", Amount: 1999, Currency: "EUR"}
	first := goCreate(svc, in)
	mustWait(t, p.arrived, "first create's claim")
	var outs []<-chan createOut
	for range dups {
		outs = append(outs, goCreate(svc, in))
	}
	waitLockWaiters(t, b.pool, dups)
	var shared, exclusive int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE mode = 'ShareLock'), count(*) FILTER (WHERE mode = 'ExclusiveLock')
		FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&shared, &exclusive); err != nil {
		t.Fatal(err)
	}
	p.let(dups + 1) // the first's claim; and any duplicate that takes a claim (the control) is not parked
	if shared != dups || exclusive != 0 {
		t.Errorf("duplicates waiting on the order's lock: %d shared, %d exclusive; want %d shared", shared, exclusive, dups)
	}
	r1 := mustWait(t, first, "first create")
	if r1.err != nil || !r1.res.Created {
		t.Fatalf("first = %+v, %v", r1.res, r1.err)
	}
	for i, ch := range outs {
		r := mustWait(t, ch, "duplicate")
		if r.err != nil || r.res.Created || r.res.Session.ID != r1.res.Session.ID {
			t.Fatalf("duplicate %d = %+v, %v; want the first's session, not created", i, r.res, r.err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if claims != 1 {
		t.Errorf("%d claims, want 1 (the duplicates read the committed session without one)", claims)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Errorf("gateway registrations = %d, want 1", n)
	}
}

// naiveCreate is the bug the first seed article starts from: check, then insert, with no lock.
// Kept here as the negative control.
func naiveCreate(ctx context.Context, pool *pgxpool.Pool, gw payments.Gateway, in payments.CreateInput, afterRead func(context.Context, string)) (string, error) {
	if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id, created_at, updated_at) VALUES ($1, now(), now()) ON CONFLICT DO NOTHING`, in.OrderID); err != nil {
		return "", err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx)
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM payment_sessions WHERE order_id = $1 AND status IN ('Registering','Registered','Unknown','Authorized','Canceling')`, in.OrderID).Scan(&n); err != nil {
		return "", err
	}
	afterRead(ctx, in.OrderID)
	if n > 0 {
		return "", nil
	}
	id := uuid.NewString()
	if _, err := tx.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, created_at, updated_at)
		VALUES ($1, $2, $3, $4, 'Registering', 'fake', now(), now())`, id, in.OrderID, in.Amount, in.Currency); err != nil {
		return "", err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", err
	}
	_, err = gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: id, Reference: id, Amount: in.Amount, Currency: in.Currency})
	return id, err
}

// The negative control: the same schedule against check-then-insert produces two sessions and two
// gateway registrations (with the partial index dropped, so only the lock could have prevented
// it), and with the index present the second click fails on it instead of being answered.
func TestCreateNaiveCheckThenInsertRegistersTwice(t *testing.T) {
	t.Parallel()
	for _, withIndex := range []bool{false, true} {
		t.Run(fmt.Sprintf("index=%v", withIndex), func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			if !withIndex {
				if _, err := b.pool.Exec(context.Background(), `DROP INDEX payment_sessions_one_active_per_order`); err != nil {
					t.Fatal(err)
				}
			}
			p := newParker()
			in := payments.CreateInput{OrderID: "order-1", Amount: 1999, Currency: "EUR"}
			errs := make(chan error, 2)
			for range 2 {
				go func() { _, err := naiveCreate(context.Background(), b.pool, b.gw, in, p.hook); errs <- err }()
			}
			mustWait(t, p.arrived, "first read")
			mustWait(t, p.arrived, "second read") // both read "no active session"
			p.let(2)
			e1, e2 := mustWait(t, errs, "naive 1"), mustWait(t, errs, "naive 2")
			if !withIndex {
				if e1 != nil || e2 != nil {
					t.Fatalf("errors: %v %v", e1, e2)
				}
				if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 2 {
					t.Fatalf("naive sessions = %d, want 2 (the bug)", n)
				}
				if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
					t.Fatalf("naive registrations = %d, want 2 (the bug)", n)
				}
				return
			}
			var pe *pgconn.PgError
			failed := e1
			if failed == nil {
				failed = e2
			}
			if !errors.As(failed, &pe) || pe.ConstraintName != "payment_sessions_one_active_per_order" {
				t.Fatalf("want one click to hit the partial index, got %v / %v", e1, e2)
			}
		})
	}
}

func TestCreateDifferentParametersConflict(t *testing.T) {
	t.Parallel()
	p := newParker()
	b := newBench(t, func(c *payments.Config) { c.Hooks.AfterClaimRead = p.hook })
	first := goCreate(b.svc, payments.CreateInput{OrderID: "o", Amount: 1000, Currency: "EUR"})
	mustWait(t, p.arrived, "first read")
	second := goCreate(b.svc, payments.CreateInput{OrderID: "o", Amount: 2000, Currency: "EUR"})
	waitLockWaiters(t, b.pool, 1)
	p.let(1)
	mustWait(t, p.arrived, "second read")
	p.let(1)
	r1, r2 := mustWait(t, first, "first"), mustWait(t, second, "second")
	if r1.err != nil {
		t.Fatal(r1.err)
	}
	if payments.ErrorCode(r2.err) != payments.ECONFLICT {
		t.Fatalf("second = %v, want conflict", r2.err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 1 {
		t.Fatalf("sessions = %d", n)
	}
	// Other currency, same amount: also a conflict.
	p.let(1)
	if _, err := b.svc.Create(context.Background(), api, payments.CreateInput{OrderID: "o", Amount: 1000, Currency: "USD"}); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("other currency = %v", err)
	}
}

// A first attempt (the caller holds a fresh idempotency key) skips the lock-free read of the
// active session and is decided by the claim under the order's lock, with the same answer: the
// active session with these parameters, not created again, nothing sent to the gateway. Any
// other Create of the hot order is still answered by the lock-free read, without the claim.
func TestCreateFirstAttemptIsDecidedByTheClaim(t *testing.T) {
	t.Parallel()
	claims := 0
	b := newBench(t, func(c *payments.Config) {
		c.Hooks.AfterClaimRead = func(context.Context, string) { claims++ }
	})
	ctx := context.Background()
	first, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o", Amount: 1000, Currency: "EUR", FirstAttempt: true})
	if err != nil || !first.Created || claims != 1 {
		t.Fatalf("first = %+v %v (claims %d)", first, err, claims)
	}
	repeat, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o", Amount: 1000, Currency: "EUR"})
	if err != nil || repeat.Created || repeat.Session.ID != first.Session.ID || claims != 1 {
		t.Fatalf("a repeat = %+v %v (claims %d), want the session from the lock-free read", repeat, err, claims)
	}
	again, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o", Amount: 1000, Currency: "EUR", FirstAttempt: true})
	if err != nil || again.Created || again.Session.ID != first.Session.ID || claims != 2 {
		t.Fatalf("a first attempt on an active order = %+v %v (claims %d), want the session from the claim", again, err, claims)
	}
	if _, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o", Amount: 2000, Currency: "EUR", FirstAttempt: true}); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("a first attempt with other parameters = %v, want conflict", err)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("registrations = %d", n)
	}
}

// 50 concurrent Creates for one order from two pools (two replicas) → one session, one
// registration.
func TestCreateFiftyClicksTwoReplicas(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	svcB := b.service(testdb.Pool(t, b.url), "replica-b")
	in := payments.CreateInput{OrderID: "busy-order", Amount: 500, Currency: "USD"}
	var wg sync.WaitGroup
	start := make(chan struct{})
	ids := make(chan string, 50)
	errs := make(chan error, 50)
	for i := range 50 {
		svc := b.svc
		if i%2 == 1 {
			svc = svcB
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := svc.Create(context.Background(), api, in)
			if err != nil {
				errs <- err
				return
			}
			ids <- res.Session.ID
		}()
	}
	close(start)
	wg.Wait()
	close(ids)
	close(errs)
	for err := range errs {
		t.Errorf("create: %v", err)
	}
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	if len(seen) != 1 {
		t.Fatalf("distinct sessions returned = %d, want 1", len(seen))
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions`); n != 1 {
		t.Fatalf("sessions = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("registrations = %d", n)
	}
}

// While the gateway holds order A's registration, another Create for A returns at once with the
// Registering session, and a Create for B is not held up by A.
func TestCreateDoesNotWaitForGateway(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	gate := b.gw.Hold(fakegw.OpRegister)
	defer gate.Open()
	a1 := goCreate(b.svc, payments.CreateInput{OrderID: "A", Amount: 100, Currency: "EUR"})
	keyA := mustWait(t, gate.Arrived(), "A's registration at the gateway")

	r, err := b.svc.Create(context.Background(), api, payments.CreateInput{OrderID: "A", Amount: 100, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Created || r.Session.Status != payments.StatusRegistering || r.Session.ID != keyA {
		t.Fatalf("repeat while registering = %+v, want the Registering session %s", r, keyA)
	}
	bOut := goCreate(b.svc, payments.CreateInput{OrderID: "B", Amount: 100, Currency: "EUR"})
	keyB := mustWait(t, gate.Arrived(), "B's registration at the gateway")
	if keyB == keyA {
		t.Fatal("B registered with A's key")
	}
	gate.Open()
	if out := mustWait(t, a1, "A"); out.err != nil || out.res.Session.Status != payments.StatusRegistered {
		t.Fatalf("A = %+v", out)
	}
	if out := mustWait(t, bOut, "B"); out.err != nil || out.res.Session.Status != payments.StatusRegistered {
		t.Fatalf("B = %+v", out)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Fatalf("registrations = %d, want 2", n)
	}
}

// The partial unique index refuses a second active session inserted behind the protocol's back.
func TestActiveSessionIndexRefusesBypass(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	r, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o", Amount: 100, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.pool.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, created_at, updated_at)
		VALUES (gen_random_uuid(), 'o', 100, 'EUR', 'Authorized', 'fake', now(), now())`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.ConstraintName != "payment_sessions_one_active_per_order" {
		t.Fatalf("bypass insert = %v, want the partial index to refuse", err)
	}
	// A terminal session beside the active one is fine: history is not limited.
	if _, err := b.pool.Exec(ctx, `INSERT INTO payment_sessions (id, order_id, amount, currency, status, gateway, created_at, updated_at)
		VALUES (gen_random_uuid(), 'o', 100, 'EUR', 'Failed', 'fake', now(), now())`); err != nil {
		t.Fatalf("terminal insert: %v", err)
	}
	_ = r
}

// Lost answer: the gateway processed the registration but the answer never came → Unknown. A
// repeat Create with the same parameters returns that session and sends nothing.
func TestCreateLostAnswerIsUnknownAndRepeatSendsNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1)
	in := payments.CreateInput{OrderID: "lost", Amount: 700, Currency: "EUR"}
	r, err := b.svc.Create(ctx, api, in)
	if err != nil {
		t.Fatal(err)
	}
	if r.Session.Status != payments.StatusUnknown || !r.Created {
		t.Fatalf("after lost answer = %s created=%v, want Unknown created", r.Session.Status, r.Created)
	}
	if b.gw.Payments() != 1 {
		t.Fatalf("gateway payments = %d, want 1 (it did act)", b.gw.Payments())
	}
	r2, err := b.svc.Create(ctx, api, in)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Created || r2.Session.ID != r.Session.ID {
		t.Fatalf("repeat = %+v", r2)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("registrations = %d, want 1", n)
	}
	// Check resolves it from the gateway by our reference: Registered, one gateway payment.
	s, err := b.svc.Check(ctx, api, r.Session.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != payments.StatusRegistered || s.GatewayPaymentID == "" {
		t.Fatalf("after check = %s %q", s.Status, s.GatewayPaymentID)
	}
	if b.gw.Payments() != 1 {
		t.Fatalf("gateway payments = %d", b.gw.Payments())
	}
}

func TestCreateOutcomesOfGatewayFailures(t *testing.T) {
	t.Parallel()
	cases := []struct {
		fault fakegw.Fault
		want  payments.Status
	}{
		{fakegw.Definitive, payments.StatusFailed},
		{fakegw.Transient, payments.StatusUnknown},
		{fakegw.NotSent, payments.StatusRegistering},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.want), func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			b.gw.Fail(fakegw.OpRegister, c.fault, 1)
			r, err := b.svc.Create(context.Background(), api, payments.CreateInput{OrderID: "o", Amount: 1, Currency: "EUR"})
			if err != nil {
				t.Fatal(err)
			}
			if r.Session.Status != c.want {
				t.Fatalf("status = %s, want %s", r.Session.Status, c.want)
			}
			o, _, err := b.svc.GetOrder(context.Background(), "o")
			if err != nil {
				t.Fatal(err)
			}
			if c.want == payments.StatusFailed && o.ActiveSessionID != "" {
				t.Fatalf("failed session still active on the order")
			}
		})
	}
}

func TestCreateValidation(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	bad := []struct {
		in    payments.CreateInput
		field string
	}{
		{payments.CreateInput{OrderID: "", Amount: 1, Currency: "EUR"}, "order_id"},
		{payments.CreateInput{OrderID: "has space", Amount: 1, Currency: "EUR"}, "order_id"},
		{payments.CreateInput{OrderID: string(make([]byte, 65)), Amount: 1, Currency: "EUR"}, "order_id"},
		{payments.CreateInput{OrderID: "o", Amount: 0, Currency: "EUR"}, "amount"},
		{payments.CreateInput{OrderID: "o", Amount: -5, Currency: "EUR"}, "amount"},
		{payments.CreateInput{OrderID: "o", Amount: payments.MaxAmount, Currency: "EUR"}, "amount"},
		{payments.CreateInput{OrderID: "o", Amount: 1, Currency: "eur"}, "currency"},
		{payments.CreateInput{OrderID: "o", Amount: 1, Currency: "EURO"}, "currency"},
	}
	for _, c := range bad {
		_, err := b.svc.Create(context.Background(), api, c.in)
		var e *payments.Error
		if !errors.As(err, &e) || e.Code != payments.EINVALID || e.Field != c.field {
			t.Errorf("%+v: err = %v, want invalid %s", c.in, err, c.field)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("invalid input wrote %d orders", n)
	}
	if b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatal("invalid input reached the gateway")
	}
}

func TestCreateRefusedForPaidOrder(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	r, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "paid", Amount: 100, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(r.Session.GatewayPaymentID, payments.GatewaySucceeded)
	if s, err := b.svc.Check(ctx, api, r.Session.ID); err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("check = %v %v", s.Status, err)
	}
	_, err = b.svc.Create(ctx, api, payments.CreateInput{OrderID: "paid", Amount: 100, Currency: "EUR"})
	if payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("create for paid order = %v, want conflict", err)
	}
}

// A client that hangs up while the gateway registers its payment (a shop's 5 s timeout against a
// gateway answering in 6) does not cut the registration: the gateway's answer is recorded, the
// session is Registered with its page, and the client's retry reads it. Before, the cut call
// left the session Unknown (the gateway may have made the payment) and the retry a payment
// without a page until the patrol found it by reference. A cut with a cause of its own (a
// replica's stop) still cuts. Negative control: Create without unlessHungUp, Unknown.
func TestAClientsHangUpDoesNotCutItsRegistration(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	gate := b.gw.Hold(fakegw.OpRegister)
	defer gate.Open()
	create := func(ctx context.Context, order string) <-chan createOut {
		ch := make(chan createOut, 1)
		go func() {
			res, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: order, Amount: 100, Currency: "EUR"})
			ch <- createOut{res, err}
		}()
		return ch
	}
	ctx, hangUp := context.WithCancel(context.Background())
	out := create(ctx, "o-hang-up")
	id := mustWait(t, gate.Arrived(), "the registration at the gateway") // its key: the session's id
	hangUp()
	gate.Open() // a call whose context ended fails even so (fakegw)
	mustWait(t, out, "the Create")
	s, err := b.svc.Get(context.Background(), id)
	if err != nil || s.Status != payments.StatusRegistered || s.ConfirmationURL == "" {
		t.Fatalf("after the client's hang-up: %s %q %v, want Registered with its page", s.Status, s.ConfirmationURL, err)
	}

	gate = b.gw.Hold(fakegw.OpRegister)
	defer gate.Open()
	stopCtx, stop := context.WithCancelCause(context.Background())
	out = create(stopCtx, "o-stopped")
	mustWait(t, gate.Arrived(), "the second registration at the gateway")
	stop(errors.New("the replica is stopping"))
	if o := mustWait(t, out, "the stopped Create"); o.err == nil && o.res.Session.Status != payments.StatusUnknown {
		t.Fatalf("a Create cut by the stop: %+v, want it cut (Unknown)", o)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 {
		t.Fatalf("registrations = %d, want 2", n)
	}
}
