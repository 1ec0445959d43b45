package handlers_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"pitlane/payments"
)

// One Pay click is one payment, "even when the first session has since failed"
// (payments/checkout_intent.go). Here the click's Create claims its session and registers it at
// the gateway, and then the database drops the connection of the transaction that writes the
// gateway's answer (the backend is terminated while AfterApplyLock holds it): the click answered
// 503 (and let its key go without binding it); it answers its session as it is now. The session ends (the customer's bank declines
// it, found by a check), and the same click sent again (the customer's "Try again" after the
// 503 page, the same form and key) started a second session and a second gateway registration
// instead of answering the click's own session (mid-transaction failures review, session 32).
// The failed click now binds its key to the session its claim committed, found by the session's
// first event (CheckoutPay). Negative control: the release without the binding starts a second
// session and a second registration.
func TestAClickWhoseApplyDiedAnswersItsOwnSessionAgain(t *testing.T) {
	t.Parallel()
	var kill func(context.Context, string)
	b := newAPIBench(t, benchOpt{core: func(c *payments.Config) {
		c.Hooks.AfterApplyLock = func(ctx context.Context, id string) {
			if kill != nil {
				kill(ctx, id)
			}
		}
	}})
	k := newKiller(t, b)
	kill, _ = k.once()
	ctx := context.Background()
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "click-1", Amount: 100, Currency: "EUR"}

	// Create answers its session as it is (Registering: its apply died; the patrol learns the
	// gateway's answer) rather than 503, as the API's Create does (an outside review, dbfail).
	res, err := b.svc.CheckoutPay(ctx, key, in, 0)
	if err != nil || res.Session.Status != payments.StatusRegistering {
		t.Fatalf("first click = %+v %v, want its session as it is (Registering)", res.Session, err)
	}
	kill = nil
	var first payments.Session
	if err := b.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE order_id = 'click-1'`).Scan(&first.ID); err != nil {
		t.Fatal(err)
	}
	first, err = b.svc.Get(ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The click's payment ends: declined at the gateway, learnt by a check.
	b.gw.SetStatusByReference(first.Reference(), payments.GatewayDeclined)
	if s, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorStaff, ID: "sup"}, first.ID); err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("check = %+v %v", s.Status, err)
	}

	again, err := b.svc.CheckoutPay(ctx, key, in, 0)
	if err != nil {
		t.Fatalf("the click again: %v", err)
	}
	sessions := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'click-1'`)
	t.Logf("click again: session %s (%s), replayed %v; sessions %d; register calls %d; gateway payments for the order %d",
		again.Session.ID, again.Session.Status, again.Replayed, sessions, b.gw.Calls("register"), b.gw.Payments())
	if again.Session.ID != first.ID || sessions != 1 {
		t.Errorf("one click, two payments: the click's first session %s (Failed), the same click again started %s (%s); %d sessions, %d registrations at the gateway",
			first.ID, again.Session.ID, again.Session.Status, sessions, b.gw.Calls("register"))
	}
}

// killer terminates backends of the bench's database from an admin connection of its own.
type killer struct {
	t     *testing.T
	admin *pgx.Conn
	db    string
}

func newKiller(t *testing.T, b *apiBench) *killer {
	t.Helper()
	var db string
	if err := b.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	return &killer{t: t, admin: adminConn(t), db: db}
}

// idleInTx kills every backend of the database that sits inside an open transaction (the one a
// hook parked) and waits until it is gone. Returns how many it killed.
func (k *killer) idleInTx() int {
	rows, err := k.admin.Query(context.Background(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
		WHERE datname = $1 AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()`, k.db)
	if err != nil {
		k.t.Errorf("kill: %v", err)
		return 0
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n
}

// once returns a hook that kills the parked transaction the first time it runs.
func (k *killer) once() (func(context.Context, string), *atomic.Int32) {
	var fired atomic.Int32
	return func(ctx context.Context, id string) {
		if fired.Add(1) == 1 {
			if n := k.idleInTx(); n != 1 {
				k.t.Errorf("killed %d backends, want 1", n)
			}
		}
	}, &fired
}
