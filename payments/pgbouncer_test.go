package payments_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"pitlane/internal/pgbouncer"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// The core behind pgbouncer in transaction mode with only 3 server connections for 2 client
// pools of 20: consecutive transactions of one client land on different server connections, so
// the protocol may rely only on transaction-scoped locks. 50 Creates → one registration; 20
// concurrent Checks after success → one ledger entry; 10 concurrent confirmations of one code →
// one reverse. Ten Creates cut while they wait on an order's claim lock: pgbouncer lives on.
func TestCoreBehindPgbouncerTransactionMode(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	through := pgbouncer.Start(t, b.url, 3)
	svc1 := b.service(testdb.Pool(t, through), "bouncer-a")
	svc2 := b.service(testdb.Pool(t, through), "bouncer-b")
	ctx := context.Background()
	run := func(n int, f func(svc *payments.Service)) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			svc := svc1
			if i%2 == 1 {
				svc = svc2
			}
			wg.Add(1)
			go func() { defer wg.Done(); <-start; f(svc) }()
		}
		close(start)
		wg.Wait()
	}
	in := payments.CreateInput{OrderID: "bounced", Amount: 1234, Currency: "EUR", CustomerContact: "c@example.com"}
	var mu sync.Mutex
	ids := map[string]bool{}
	run(50, func(svc *payments.Service) {
		r, err := svc.Create(ctx, api, in)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		ids[r.Session.ID] = true
		mu.Unlock()
	})
	if len(ids) != 1 || b.gw.Calls(fakegw.OpRegister) != 1 {
		t.Fatalf("sessions %d, registrations %d; want 1, 1", len(ids), b.gw.Calls(fakegw.OpRegister))
	}
	var id string
	for k := range ids {
		id = k
	}

	// Creates cut while they wait on an order's claim lock (another transaction holds it, on
	// PostgreSQL directly): each is canceled on the server through pgbouncer, which lives on, and
	// nothing is registered until the lock is free; then one Create registers the order once.
	// pgx's own cancel handling crashed pgbouncer 1.18 at the first such cut (payments/dbconn).
	held, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx)
	if _, err := held.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext('bounced-cut'))`, int32(payments.LockCreateOrder)); err != nil {
		t.Fatal(err)
	}
	cut := payments.CreateInput{OrderID: "bounced-cut", Amount: 1234, Currency: "EUR", CustomerContact: "c@example.com"}
	run(10, func(svc *payments.Service) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := svc.Create(cctx, api, cut); err == nil {
			t.Error("a Create went through a held claim lock")
		}
	})
	if err := held.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := svc2.Create(ctx, api, cut); err != nil {
		t.Fatalf("the Create once the lock is free (pgbouncer still there?): %v", err)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 2 || b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'bounced-cut'`) != 1 {
		t.Fatalf("%d registrations in all, want 2 (one per order) and one session of the cut order", n)
	}
	sess, _ := b.svc.Get(ctx, id)
	// Cancel race on a second order; payment success on the first.
	r2, err := svc1.Create(ctx, api, payments.CreateInput{OrderID: "bounced-2", Amount: 1, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := svc2.RequestCancel(ctx, api, r2.Session.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, r2.Session.ID)
	run(10, func(svc *payments.Service) {
		if _, err := svc.ConfirmCancel(ctx, api, r2.Session.ID, ch.ID, code); err != nil {
			t.Error(err)
		}
	})
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewaySucceeded)
	run(20, func(svc *payments.Service) {
		if _, err := svc.Check(ctx, api, id); err != nil {
			t.Error(err)
		}
	})
	if n := b.count(t, `SELECT count(*) FROM accounting_entries`); n != 1 {
		t.Fatalf("ledger entries = %d", n)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 1 {
		t.Fatalf("reverses = %d", n)
	}
	checkInvariants(t, b)
}

// The console's reads behind pgbouncer in transaction mode: a finance page's rows and totals in
// one read-only repeatable-read transaction (readPage), the payments search as an unnamed
// statement planned with its values (pgx.QueryExecModeExec), each page read many times from two
// pools over 2 server connections, so they land on connections other reads left behind.
func TestConsoleReadsBehindPgbouncerTransactionMode(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	for i := range 3 {
		s := b.registered(t, "o-bounced-read-"+string(rune('a'+i)), 100)
		if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET flagged_at = $2::timestamptz, flag_reason = 'schedule ran out', created_at = $2::timestamptz - interval '1 hour'
			WHERE id = $1`, s.ID, b.clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	through := pgbouncer.Start(t, b.url, 2)
	svcs := []*payments.Service{b.service(testdb.Pool(t, through), "bouncer-a"), b.service(testdb.Pool(t, through), "bouncer-b")}
	var wg sync.WaitGroup
	for i := range 20 {
		svc := svcs[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p, err := svc.StuckSessions(ctx, payments.StuckFilter{}); err != nil || len(p.Sessions) != 3 {
				t.Errorf("stuck page through pgbouncer: %d rows, %v", len(p.Sessions), err)
			}
			if f, err := svc.ListFlagged(ctx, ""); err != nil || f.Total != 3 || len(f.Sessions) != 3 {
				t.Errorf("flagged page through pgbouncer: %d of %d, %v", len(f.Sessions), f.Total, err)
			}
			if _, err := svc.ListCases(ctx, false, 0); err != nil {
				t.Errorf("cases page through pgbouncer: %v", err)
			}
			if p, err := svc.ListPayments(ctx, payments.PaymentFilter{Query: "o-bounced-read-"}); err != nil || len(p.Sessions) != 3 {
				t.Errorf("payments search through pgbouncer: %d rows, %v", len(p.Sessions), err)
			}
		}()
	}
	wg.Wait()
}
