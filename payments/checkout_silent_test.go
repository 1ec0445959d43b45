package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A Pay click runs on past its request (the browser abandons a double click's first one) but not
// past its hold on the key: on a database that answers nothing (every connection of the replica's
// pool taken) the click ends when its hold does, as "try again" (EUNAVAIL: the customer's 503
// page), with nothing started; the same click goes through once the database answers. Before,
// the click waited as long as the database stayed silent.
//
// Negative control: with the click's context detached and unbounded again (context.WithoutCancel
// alone), the click is "still waiting" and the test fails.
func TestCheckoutPayOnASilentDatabaseEndsWithItsHold(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	one := testdb.PoolOf(t, b.pool, 1)
	svc := b.service(one, "silent")
	held, err := one.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Release)
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "o-silent", Amount: 1200, Currency: "EUR"}
	const hold = 300 * time.Millisecond

	done := make(chan error, 1)
	go func() {
		_, err := svc.CheckoutPay(context.Background(), key, in, hold)
		done <- err
	}()
	select {
	case err := <-done:
		if payments.ErrorCode(err) != payments.EUNAVAIL {
			t.Fatalf("a click on a silent database: %v (%s), want unavailable", err, payments.ErrorCode(err))
		}
	case <-time.After(30 * time.Second):
		held.Release()
		<-done
		t.Fatal("the click on a silent database is still waiting 30 s after its hold of 300 ms ran out")
	}
	if n := b.count(t, `SELECT count(*) FROM checkout_intents WHERE key = $1`, key); n != 0 || b.gw.Calls(fakegw.OpRegister) != 0 {
		t.Fatalf("a click cut before it started: %d intents, %d registrations", n, b.gw.Calls(fakegw.OpRegister))
	}

	held.Release()
	// A hold of its own for the click that goes through: 300 ms is the silent database's bound,
	// and a loaded CI machine took longer than that to acquire the intent (a flake, not a cut).
	res, err := svc.CheckoutPay(context.Background(), key, in, 30*time.Second)
	if err != nil || res.Session.Status != payments.StatusRegistered {
		t.Fatalf("the same click once the database answers: %+v %v", res, err)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("%d registrations, want one", n)
	}
}
