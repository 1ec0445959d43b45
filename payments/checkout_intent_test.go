package payments_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// TestCheckoutPayOneClickOneSession: the second request of one Pay click arrives while the first
// is registering at the gateway. It is told to wait (EBUSY) and creates nothing; afterwards
// every retry of the click replays the session the first request created.
func TestCheckoutPayOneClickOneSession(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	gate := b.gw.Hold(fakegw.OpRegister)
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "o-click", Amount: 1999, Currency: "EUR"}

	first := make(chan error, 1)
	var res payments.CheckoutPayResult
	go func() {
		var err error
		res, err = b.svc.CheckoutPay(context.Background(), key, in, 0)
		first <- err
	}()
	mustWait(t, gate.Arrived(), "the first request at the gateway")
	if _, err := b.svc.CheckoutPay(context.Background(), key, in, 0); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("second request of the click: %v, want busy", err)
	}
	it, err := b.svc.GetCheckoutIntent(context.Background(), key)
	if err != nil || !it.InFlight(b.clock.Now()) {
		t.Fatalf("intent while registering: %+v %v", it, err)
	}
	gate.Open()
	if err := mustWait(t, first, "the first request"); err != nil {
		t.Fatal(err)
	}
	again, err := b.svc.CheckoutPay(context.Background(), key, in, 0)
	if err != nil || !again.Replayed || again.Session.ID != res.Session.ID {
		t.Fatalf("retry of the click: %+v %v, want a replay of %s", again, err, res.Session.ID)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("%d registrations, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = 'o-click'`); n != 1 {
		t.Fatalf("%d sessions, want 1", n)
	}
	// The key belongs to this order and amount only.
	other := in
	other.Amount = 1
	if _, err := b.svc.CheckoutPay(context.Background(), key, other, 0); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("same key, other amount: %v", err)
	}
}

// TestCheckoutPayStaleClickIsTakenOver: a click whose request died (its key held, no session
// bound) is taken over once the hold is stale, and Create's per-order claim finds the session
// the dead request had already claimed: still one session, one registration.
func TestCheckoutPayStaleClickIsTakenOver(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	key := uuid.NewString()
	in := payments.CreateInput{OrderID: "o-stale", Amount: 700, Currency: "EUR"}
	res, err := b.svc.CheckoutPay(context.Background(), key, in, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Simulate the crash between Create and binding: unbind and hold the key as a live request would.
	if _, err := b.pool.Exec(context.Background(), `UPDATE checkout_intents SET session_id = NULL, locked_until = $2 WHERE key = $1`,
		key, b.clock.Now().Add(payments.StaleAfterFor(0))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.CheckoutPay(context.Background(), key, in, 0); payments.ErrorCode(err) != payments.EBUSY {
		t.Fatalf("before the hold is stale: %v", err)
	}
	b.clock.Advance(payments.StaleAfterFor(0))
	got, err := b.svc.CheckoutPay(context.Background(), key, in, 0)
	if err != nil || got.Session.ID != res.Session.ID {
		t.Fatalf("take-over: %+v %v, want session %s", got, err, res.Session.ID)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != 1 {
		t.Fatalf("%d registrations, want 1", n)
	}
}

// A Pay click from the checkout page and the shop making a newer link for another amount, at
// once: the click's claim is parked after its read, holding the order's lock; the link waits for
// that lock (seen in pg_locks), and when the click's session at the old price exists, the link
// is refused (the order has an active payment of another amount), never made beside it. So a
// shop told "here is your new link" can never find the order paid at the old price by a click
// that raced it.
// Negative control (run by hand): with CheckoutLink not taking the order's lock, the link is
// made while the old price's session is created.
func TestCheckoutLinkWaitsForAPayClickInItsClaim(t *testing.T) {
	t.Parallel()
	p := newParker()
	b := newBench(t, func(c *payments.Config) { c.Hooks.AfterClaimRead = p.hook })
	ctx := context.Background()
	if _, err := b.svc.CheckoutLink(ctx, "o-race-price", 1000, "EUR", 0); err != nil {
		t.Fatal(err)
	}
	clicked := make(chan error, 1)
	go func() {
		_, err := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: "o-race-price", Amount: 1000, Currency: "EUR"}, 0)
		clicked <- err
	}()
	mustWait(t, p.arrived, "the click's claim to read")
	linked := make(chan error, 1)
	go func() {
		_, err := b.svc.CheckoutLink(ctx, "o-race-price", 1500, "EUR", 0)
		linked <- err
	}()
	waitLockWaiters(t, b.pool, 1)
	p.let(1)
	if err := mustWait(t, clicked, "the click"); err != nil {
		t.Fatalf("the click: %v", err)
	}
	if err := mustWait(t, linked, "the link"); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("the new link = %v, want a conflict with the click's payment", err)
	}
	if price, _, _ := b.svc.CheckoutPrice(ctx, "o-race-price"); price.Amount != 1000 {
		t.Fatalf("the order's checkout price = %d, want the old 1000 (the new link was not made)", price.Amount)
	}
}

// The order's contact is the shop's: a Pay click from the checkout page (anyone holding the
// order's link or page) gives its own payment a contact, and fills the order's only when it has
// none. Otherwise a link holder could redirect the codes of the shop's later payments that name
// no contact (a cancel's one-time code) to an address of their choosing.
// Negative control (run by hand): with the click's contact overwriting the order's, the later
// payment's cancel code goes to the click's address.
func TestCheckoutClickDoesNotTakeOverTheOrdersContact(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	declined := func(s payments.Session) {
		t.Helper()
		b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayDeclined)
		if got, err := b.svc.Check(ctx, api, s.ID); err != nil || got.Status != payments.StatusFailed {
			t.Fatalf("check = %+v %v", got, err)
		}
	}
	first, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-contact", Amount: 900, Currency: "EUR", CustomerContact: "customer@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	declined(first.Session)
	click, err := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: "o-contact", Amount: 900, Currency: "EUR",
		CustomerContact: "someone-else@example.com"}, 0)
	if err != nil || click.Session.CustomerContact != "someone-else@example.com" {
		t.Fatalf("the click = %+v %v, want its own contact", click.Session, err)
	}
	declined(click.Session)
	later, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-contact", Amount: 900, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.RequestCancel(ctx, api, later.Session.ID); err != nil {
		t.Fatal(err)
	}
	var to string
	if err := b.pool.QueryRow(ctx, `SELECT to_addr FROM outbox WHERE payment_id = $1 ORDER BY id DESC LIMIT 1`, later.Session.ID).Scan(&to); err != nil {
		t.Fatal(err)
	}
	if to != "customer@example.com" {
		t.Fatalf("the later payment's cancel code went to %q, want the order's customer@example.com", to)
	}
	// An order with no contact yet takes the click's.
	fresh, err := b.svc.CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: "o-contact-new", Amount: 900, Currency: "EUR",
		CustomerContact: "payer@example.com"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	declined(fresh.Session)
	if n := b.count(t, `SELECT count(*) FROM orders WHERE order_id = 'o-contact-new' AND customer_contact = 'payer@example.com'`); n != 1 {
		t.Fatal("an order with no contact did not take the click's")
	}
}

// A click on an order whose payment is under way starts nothing and writes no key
// (checkoutPayKeyless). Should that payment end between the click's look at the order and its
// Create, the click does start one: its key is then written, bound to the new session, and
// counted against the order's budget like any start — a repeat of the click replays it. The
// interleaving is made on purpose: the patrol's check fails the first payment in the hook after
// the click's acquire. Negative control: the key not written for a keyless click that created
// a session, the repeat is not a replay and nothing is counted.
func TestCheckoutKeylessClickThatStartsAPaymentAfterAllIsCounted(t *testing.T) {
	t.Parallel()
	b, endNext, _ := endsBetweenLookAndCreate(t)
	ctx := context.Background()
	in := payments.CreateInput{OrderID: "o-keyless-start", Amount: 1999, Currency: "EUR"}
	first, err := b.svc.CheckoutPay(ctx, uuid.NewString(), in, 0)
	if err != nil {
		t.Fatal(err)
	}
	endNext(first.Session)
	key := uuid.NewString()
	second, err := b.svc.CheckoutPay(ctx, key, in, 0)
	if err != nil || second.Session.ID == first.Session.ID || second.Session.Status != payments.StatusRegistered {
		t.Fatalf("the click after the first payment ended: %+v %v, want a new payment", second.Session, err)
	}
	if it, err := b.svc.GetCheckoutIntent(ctx, key); err != nil || it.SessionID != second.Session.ID {
		t.Fatalf("the click's key: %+v %v, want it bound to the payment it started", it, err)
	}
	if again, err := b.svc.CheckoutPay(ctx, key, in, 0); err != nil || !again.Replayed || again.Session.ID != second.Session.ID {
		t.Fatalf("a repeat of the click: %+v %v, want a replay", again, err)
	}
	if n := b.count(t, `SELECT count(*) FROM checkout_intents WHERE order_id = $1`, in.OrderID); n != 2 {
		t.Fatalf("counted starts = %d, want both clicks that started a payment", n)
	}
}

// A click judged to start nothing (a payment of the order under way) writes no key and spends
// none of the order's CheckoutStartsPerHour; when that payment ends between the click's look
// and its Create, the click starts one after all, and the claim must hold it to the budget: with
// the hour's ten starts spent, it is refused (ELOCKED, with when a start frees up), and the
// gateway registers nothing (an outside review: the 11th payment of the hour, repeatable by
// anyone holding the link). Negative control: without the claim's count, an 11th payment.
func TestCheckoutClickStartingAfterAllIsHeldToTheBudget(t *testing.T) {
	t.Parallel()
	b, endNext, decline := endsBetweenLookAndCreate(t)
	ctx := context.Background()
	in := payments.CreateInput{OrderID: "o-budget-race", Amount: 1999, Currency: "EUR"}
	// Ten clicks within the hour, each its own payment: nine declined, the tenth under way.
	var last payments.Session
	for i := 0; i < payments.CheckoutStartsPerHour; i++ {
		b.clock.Advance(time.Minute)
		res, err := b.svc.CheckoutPay(ctx, uuid.NewString(), in, 0)
		if err != nil {
			t.Fatalf("click %d: %v", i+1, err)
		}
		last = res.Session
		if i < payments.CheckoutStartsPerHour-1 {
			decline(last)
		}
	}
	registered := b.gw.Calls(fakegw.OpRegister)
	endNext(last) // after the 11th click's look, before its Create
	res, err := b.svc.CheckoutPay(ctx, uuid.NewString(), in, 0)
	var pe *payments.Error
	if payments.ErrorCode(err) != payments.ELOCKED || !errors.As(err, &pe) || pe.RetryAfter != 51*time.Minute {
		t.Fatalf("the 11th click of the hour: %+v %v, want ELOCKED until the first click is an hour old (51 min)", res.Session, err)
	}
	if n := b.count(t, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, in.OrderID); n != payments.CheckoutStartsPerHour {
		t.Fatalf("%d payments of the order, want %d", n, payments.CheckoutStartsPerHour)
	}
	if n := b.gw.Calls(fakegw.OpRegister); n != registered {
		t.Fatalf("%d more registrations at the gateway", n-registered)
	}
}

// Such a click's start is written in Create's claim, with its payment: written after Create
// returned (after the gateway's answer), it left a gap in which the payment could end (a
// registration refused inside Create) and another click count one start too few (an outside
// review). While the new payment is still registering at the gateway, its click's start is
// there, bound to it. Negative control: the row written after Create is missing then.
func TestCheckoutClickStartingAfterAllIsCountedWithItsPayment(t *testing.T) {
	t.Parallel()
	b, endNext, _ := endsBetweenLookAndCreate(t)
	ctx := context.Background()
	in := payments.CreateInput{OrderID: "o-start-counted", Amount: 1999, Currency: "EUR"}
	first, err := b.svc.CheckoutPay(ctx, uuid.NewString(), in, 0)
	if err != nil {
		t.Fatal(err)
	}
	endNext(first.Session)
	gate := b.gw.Hold(fakegw.OpRegister)
	key := uuid.NewString()
	done := make(chan error, 1)
	go func() { _, err := b.svc.CheckoutPay(ctx, key, in, 0); done <- err }()
	mustWait(t, gate.Arrived(), "the click's payment at the gateway")
	var bound string
	err = b.pool.QueryRow(ctx, `SELECT coalesce(ci.session_id::text, '') FROM checkout_intents ci
		JOIN payment_sessions ps ON ps.id = ci.session_id WHERE ci.key = $1 AND ps.status = 'Registering'`, key).Scan(&bound)
	gate.Open()
	if err != nil || bound == "" {
		t.Fatalf("while its payment registers, the click's start: %q %v; want it written, bound to the payment", bound, err)
	}
	if err := mustWait(t, done, "the click"); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM checkout_intents WHERE order_id = $1`, in.OrderID); n != 2 {
		t.Fatalf("counted starts = %d, want 2", n)
	}
}

// endsBetweenLookAndCreate is a bench whose next Pay click, once its look at the order is made
// (the hook after the click's acquire), declines and checks the payment given to end (the
// interleaving of a payment ending between a click's look and its Create), and a decline that
// ends a payment through the gateway's word and a check.
func endsBetweenLookAndCreate(t *testing.T) (b *bench, endNext func(payments.Session), decline func(payments.Session)) {
	var end func()
	b = newBench(t, func(c *payments.Config) {
		c.Hooks.AfterIntentAcquire = func(context.Context, string) {
			if f := end; f != nil {
				end = nil
				f()
			}
		}
	})
	decline = func(s payments.Session) {
		b.gw.SetStatus(s.GatewayPaymentID, payments.GatewayDeclined)
		if got, err := b.plain.Check(context.Background(), api, s.ID); err != nil || got.Status != payments.StatusFailed {
			t.Errorf("decline %s: %s %v", s.ID, got.Status, err)
		}
	}
	return b, func(s payments.Session) { end = func() { decline(s) } }, decline
}
