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

// lapseDuringLookup: a session whose registration answer was lost (no gateway id, nothing at
// the gateway) is claimed by replica A; A's look-up by reference is held at the gateway past
// A's lease; replica B claims the session (a new token) and its look-up is held too; then both
// look-ups answer "nothing". Only the lease holder (B) may now send the registration again:
// A lost its lease before it would act. The gateway ignores idempotency keys (the case the
// look-up-first rule exists for), so a second Register is a second gateway payment.
//
// It returns the register calls made under the session's key after the look-ups, and the
// gateway payments carrying the session's reference.
func lapseDuringLookup(t *testing.T, canceling bool) (registers, atGateway int) {
	t.Helper()
	const lease = time.Minute
	b := newBench(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	// The Create's registration and (for the cancel) the cancel's own repeat get a 503 before
	// processing: nothing at the gateway, and the session keeps no gateway id.
	faults := 1
	if canceling {
		faults = 2
	}
	b.gw.Fail(fakegw.OpRegister, fakegw.Transient, faults)
	res, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-lapse-lookup", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Session.ID
	if canceling {
		ch, err := b.svc.RequestCancel(ctx, api, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.svc.ConfirmCancel(ctx, api, id, ch.ID, b.lastCode(t, id)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := b.svc.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := payments.StatusUnknown
	if canceling {
		want = payments.StatusCanceling
	}
	if s.Status != want || s.GatewayPaymentID != "" || b.gw.PaymentsWithReference(id) != 0 {
		t.Fatalf("setup: session %s gw=%q payments=%d, want %s with nothing at the gateway", s.Status, s.GatewayPaymentID, b.gw.PaymentsWithReference(id), want)
	}
	before := b.gw.KeyCalls(fakegw.OpRegister, id)

	b.clock.Advance(5 * time.Minute) // due for the patrol (past every grace)
	find := b.gw.Hold(fakegw.OpFind)
	defer find.Open()
	withLease := func(c *payments.Config) { c.LeaseDuration = lease }
	svcA := b.service(testdb.Pool(t, b.url), "replica-a", withLease)
	svcB := b.service(testdb.Pool(t, b.url), "replica-b", withLease)

	doneA := make(chan struct{})
	go func() { defer close(doneA); _, _ = svcA.SweepOnce(ctx) }()
	mustWait(t, find.Arrived(), "A's look-up by reference at the gateway")

	b.clock.Advance(lease + time.Second) // A's lease runs out while its look-up is on the wire
	doneB := make(chan struct{})
	go func() { defer close(doneB); _, _ = svcB.SweepOnce(ctx) }()
	mustWait(t, find.Arrived(), "B's look-up by reference at the gateway (B holds the lease now)")

	find.Open() // both look-ups answer: nothing under the reference yet
	mustWait(t, doneA, "A's round")
	mustWait(t, doneB, "B's round")
	registers, atGateway = b.gw.KeyCalls(fakegw.OpRegister, id)-before, b.gw.PaymentsWithReference(id)
	after, _ := b.svc.Get(ctx, id)
	gps, _ := b.gw.FindByReference(ctx, id)
	var listed []string
	for _, gp := range gps {
		listed = append(listed, fmt.Sprintf("%s=%s", gp.ID, gp.Status))
	}
	t.Logf("session %s (gateway payment %q); at the gateway under its reference: %v; open cases: %d",
		after.Status, after.GatewayPaymentID, listed, b.count(t, `SELECT count(*) FROM finance_cases WHERE resolved_at IS NULL`))
	return registers, atGateway
}

// A drive whose lease runs out while it looks a payment up by our reference (its registration's
// answer was lost) must not register it again beside the replica that took the lease over. The
// Unknown branch checked its lease after the look-up; the Canceling branch (driveReverse) only
// before it, so with a gateway that ignores keys both replicas registered: two gateway payments,
// one reversed and the other left pending with no case (an outside review, lease). Negative
// control: without the lease check before registerAgain in driveReverse the canceling subtest
// counts 2 register calls and 2 gateway payments.
func TestALeaseLostDuringTheLookUpRegistersNothing(t *testing.T) {
	t.Parallel()
	for _, canceling := range []bool{false, true} {
		t.Run(map[bool]string{false: "unknown", true: "canceling"}[canceling], func(t *testing.T) {
			t.Parallel()
			regs, pays := lapseDuringLookup(t, canceling)
			if regs != 1 || pays != 1 {
				t.Fatalf("after A's lease lapsed: %d register calls, %d gateway payments; want 1 and 1 (only the lease holder registers)", regs, pays)
			}
		})
	}
}

// A cancel confirmed while a patrol drive re-registers an Unknown payment (its answer lost,
// nothing found by our reference; the confirm takes the drive's lease) registers nothing beside
// it: the confirm's own drive would look up nothing yet and register again, and a gateway that
// ignores keys made a second payment (an outside review, sweeper). The patrol sends the reverse
// once the drive's lease is over: one registration, one gateway payment, reversed
// (TestCancelWhileTheRegistrationIsInFlightReversesWhatAppears: Create's registration on its
// way). Negative control: with the confirm's drive run whatever is on its way, 3 registrations
// (Create's refused one, the drive's, the confirm's) and 2 gateway payments.
func TestACancelConfirmedUnderADriveRegisteringRegistersNothingBeside(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-cancel-beside-patrol", 1000).ID // Create's registration: 503, nothing made
	b.clock.Advance(5 * time.Minute)
	held := b.gw.Hold(fakegw.OpRegister)
	defer held.Open()
	done := make(chan struct{})
	go func() { defer close(done); _, _ = b.service(b.pool, "replica-a2").SweepOnce(ctx) }()
	mustWait(t, held.Arrived(), "the drive's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister) // a registration beside it would go straight through

	ch, err := b.svc.RequestCancel(ctx, api, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, api, id, ch.ID, b.lastCode(t, id)); err != nil {
		t.Fatalf("confirm: %v", err)
	}
	held.Open()
	mustWait(t, done, "the drive")
	if regs, pays := b.gw.KeyCalls(fakegw.OpRegister, id), b.gw.PaymentsWithReference(id); regs != 2 || pays != 1 {
		t.Fatalf("%d register calls, %d gateway payments; want Create's refused one and the drive's, and one payment", regs, pays)
	}
	b.clock.Advance(time.Hour)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if s, err := b.svc.Get(ctx, id); err != nil || s.Status != payments.StatusCanceled || b.gw.PaymentsWithReference(id) != 1 {
		t.Fatalf("after the patrol: %s %v, %d gateway payments; want Canceled, one", s.Status, err, b.gw.PaymentsWithReference(id))
	}
}

// A cancel's registration refused while its payment was found meanwhile (a Check, a webhook
// attached the gateway's payment under our reference) does not close the session as "nothing to
// reverse": the session names a payment now, and the patrol reverses it. Before, the refusal
// settled it Canceled and the payment stayed pending at the gateway, never reversed (an outside
// review, states; the gateway's contract forbids refusing a key it has a payment for, so this
// takes a gateway that breaks it). Negative control: without the gateway id look in
// finishCancelNoPayment, Canceled with the payment left pending.
func TestACancelRefusedAfterItsPaymentWasFoundStillReversesIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	id := b.unregistered(t, "o-cancel-found-meanwhile", 1000).ID
	ch, err := b.svc.RequestCancel(ctx, api, id)
	if err != nil {
		t.Fatal(err)
	}
	held := b.gw.Hold(fakegw.OpRegister)
	defer held.Open()
	confirmed := goConfirm(b.svc, id, ch.ID, b.lastCode(t, id))
	mustWait(t, held.Arrived(), "the cancel's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	// Meanwhile the payment appears under our reference and a Check attaches it.
	gp, err := b.gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: "elsewhere", Reference: id, Amount: 1000, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := b.svc.Check(ctx, api, id); err != nil || s.GatewayPaymentID != gp.ID {
		t.Fatalf("check: %+v %v, want the payment attached", s, err)
	}
	b.gw.Fail(fakegw.OpRegister, fakegw.Definitive, 1) // the held registration is refused
	held.Open()
	if r := mustWait(t, confirmed, "the confirmation"); r.err != nil {
		t.Fatalf("confirm: %v", r.err)
	}
	b.clock.Advance(time.Hour)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := b.svc.Get(ctx, id)
	if got, _ := b.gw.Payment(gp.ID); err != nil || s.Status != payments.StatusCanceled || got.Status != payments.GatewayReversed {
		t.Fatalf("after the patrol: %s %v, the gateway's payment %s; want Canceled and reversed", s.Status, err, got.Status)
	}
}
