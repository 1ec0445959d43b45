package payments_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// goesOnGateway is the fake gateway as a real one behaves when its client hangs up: a request
// already received is processed to its end (the answer just has nobody to go to). The caller
// sees an unknown failure at once when its context ends.
type goesOnGateway struct {
	*fakegw.Gateway
	processed chan struct{}
}

func (g *goesOnGateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	type res struct {
		gp  payments.GatewayPayment
		err error
	}
	ch := make(chan res, 1)
	go func() {
		gp, err := g.Gateway.Register(context.WithoutCancel(ctx), req)
		ch <- res{gp, err}
		close(g.processed)
	}()
	select {
	case r := <-ch:
		return r.gp, r.err
	case <-ctx.Done():
		return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureUnknown, Op: "register", Err: ctx.Err()}
	}
}

// A patrol drive re-registering an Unknown payment is cut by the replica's stop while its
// registration is on the wire. The row was handed back due now, and the next replica looked up by
// reference (nothing yet: the cut request was still being processed) and registered again beside
// it: at a gateway that ignores keys (the case the look-up-first rule exists for), two gateway
// payments for one session (an outside review, stop). A cut drive's row is due once its call can
// no longer be in flight (RegisterGrace). Negative control (run by hand): released due now, two
// payments.
func TestARegistrationCutByTheStopIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-stop-cut-register", 1000).ID
	b.clock.Advance(5 * time.Minute) // due for the patrol

	wrapped := &goesOnGateway{Gateway: b.gw, processed: make(chan struct{})}
	a := b.service(b.pool, "replica-stopping", func(c *payments.Config) { c.Gateway = wrapped })
	held := b.gw.Hold(fakegw.OpRegister)
	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan struct{})
	go func() { defer close(aDone); _, _ = a.SweepOnce(actx) }()
	mustWait(t, held.Arrived(), "A's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	stopA() // SIGTERM: A's drive is cut at its gateway call
	mustWait(t, aDone, "A's round")
	var due time.Time
	var status string
	if err := b.pool.QueryRow(ctx, `SELECT status, next_check_at FROM payment_sessions WHERE id = $1`, id).Scan(&status, &due); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the stop: %s, due in %s (the cut registration is still being processed at the gateway)", status, due.Sub(b.clock.Now()))

	b.clock.Advance(2 * time.Second) // SWEEP_INTERVAL: replica B's next round
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	held.Open() // the gateway finishes the request A's stop hung up on
	mustWait(t, wrapped.processed, "A's cut registration processed")
	regs, pays := b.gw.KeyCalls(fakegw.OpRegister, id), b.gw.PaymentsWithReference(id)
	if pays != 1 {
		t.Fatalf("one session, %d register calls under its key, %d gateway payments under its reference: "+
			"the drive cut by the stop was handed back due now and replica B registered again while the cut request was still in flight", regs, pays)
	}
}

// An API Create whose registration is on the wire when the replica's stop cuts the request
// (web.ErrStopping: the grace ran out). The session was left Unknown due after the schedule's
// first step (5 s), not after RegisterGrace from its claim (the time a registration may still be
// in flight); another replica's patrol then looked up by reference, found nothing (the cut
// request still being processed) and registered again beside it (an outside review, stop).
// Negative control (run by hand): due at the first step, two payments.
func TestACreateCutByTheStopWaitsOutItsRegistrationsGrace(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	wrapped := &goesOnGateway{Gateway: b.gw, processed: make(chan struct{})}
	a := b.service(b.pool, "replica-stopping", func(c *payments.Config) { c.Gateway = wrapped })
	held := b.gw.Hold(fakegw.OpRegister)
	rctx, cut := context.WithCancelCause(ctx)
	type res struct {
		r   payments.CreateResult
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := a.Create(rctx, api, payments.CreateInput{OrderID: "o-stop-cut-create", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
		done <- res{r, err}
	}()
	id := mustWait(t, held.Arrived(), "the Create's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	b.clock.Advance(time.Second)
	cut(errors.New("the replica is stopping")) // the stop's grace ran out: requests cut with a cause
	r := mustWait(t, done, "the Create to answer")
	var due, created time.Time
	var status string
	if err := b.pool.QueryRow(ctx, `SELECT status, next_check_at, created_at FROM payment_sessions WHERE id = $1`, id).Scan(&status, &due, &created); err != nil {
		t.Fatal(err)
	}
	if grace := created.Add(payments.StaleAfterFor(0)); due.Before(grace) {
		t.Errorf("Create answered %v / %v; session %s due %s after its claim, before RegisterGrace (%s): the cut registration may be in flight",
			r.r.Session.Status, r.err, status, due.Sub(created), payments.StaleAfterFor(0))
	}
	// The schedule's first step after the cut: the patrol leaves it alone.
	b.clock.Advance(6 * time.Second)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	held.Open() // the gateway finishes the request the stop hung up on
	mustWait(t, wrapped.processed, "the cut registration processed")
	// Due: the patrol finds it by reference, and sends nothing again.
	b.clock.Set(due)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if pays := b.gw.PaymentsWithReference(id); pays != 1 {
		t.Fatalf("one session, %d register calls, %d gateway payments: the Create's registration cut by the stop "+
			"was registered again by the patrol while it could still be in flight", b.gw.KeyCalls(fakegw.OpRegister, id), pays)
	}
}

// A cancel confirmed inside a cut Create's grace leaves the reverse to the patrol once the cut
// registration can no longer be in flight: the confirm's own drive found nothing by reference
// and registered again beside it (an outside review of the rule above). Negative control (run by
// hand): without registrationInFlight, two payments.
func TestACancelInsideACutCreatesGraceDoesNotRegisterBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	wrapped := &goesOnGateway{Gateway: b.gw, processed: make(chan struct{})}
	a := b.service(b.pool, "replica-stopping", func(c *payments.Config) { c.Gateway = wrapped })
	held := b.gw.Hold(fakegw.OpRegister)
	rctx, cut := context.WithCancelCause(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := a.Create(rctx, api, payments.CreateInput{OrderID: "o-cut-then-cancel", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
		done <- err
	}()
	id := mustWait(t, held.Arrived(), "the Create's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	b.clock.Advance(time.Second)
	cut(errors.New("the replica is stopping"))
	mustWait(t, done, "the Create to answer")
	ch, err := b.svc.RequestCancel(ctx, api, id)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(20 * time.Second) // the customer reads the code back
	res, err := b.svc.ConfirmCancel(ctx, api, id, ch.ID, b.lastCode(t, id))
	if err != nil || res.Session.Status != payments.StatusCanceling {
		t.Fatalf("confirm = %s %v, want Canceling (the reverse the patrol's)", res.Session.Status, err)
	}
	held.Open()
	mustWait(t, wrapped.processed, "the cut registration processed")
	b.clock.Advance(payments.StaleAfterFor(0))
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if pays := b.gw.PaymentsWithReference(id); pays != 1 {
		t.Errorf("one session, %d register calls, %d gateway payments: the cancel registered again while the cut Create's registration was in flight",
			b.gw.KeyCalls(fakegw.OpRegister, id), pays)
	}
	if got, _ := b.plain.Get(ctx, id); got.Status != payments.StatusCanceled {
		t.Errorf("after the patrol: %s, want Canceled", got.Status)
	}
}

// timesOutGateway is a gateway whose adapter gives up on a registration at once (its
// GATEWAY_TIMEOUT) while the gateway goes on processing it.
type timesOutGateway struct {
	*fakegw.Gateway
	processed chan struct{}
}

func (g *timesOutGateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	go func() {
		_, _ = g.Gateway.Register(context.WithoutCancel(ctx), req)
		close(g.processed)
	}()
	return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureUnknown, Op: "register", Err: context.DeadlineExceeded}
}

// A patrol drive's registration given up at its own timeout is as much on the wire as one cut
// by the stop: the next look waits RegisterGrace from its send (it was due at the schedule's
// step, 10 s, and registered beside it: a review of the rule above). Negative control (run by
// hand): without holdForRegistration, two payments.
func TestAPatrolRegistrationThatTimedOutIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-timeout-register", 1000).ID
	b.clock.Advance(5 * time.Minute)
	sent := b.clock.Now()
	wrapped := &timesOutGateway{Gateway: b.gw, processed: make(chan struct{})}
	a := b.service(b.pool, "replica-a2", func(c *payments.Config) { c.Gateway = wrapped })
	held := b.gw.Hold(fakegw.OpRegister)
	if _, err := a.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	mustWait(t, held.Arrived(), "A's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	var due time.Time
	if err := b.pool.QueryRow(ctx, `SELECT next_check_at FROM payment_sessions WHERE id = $1`, id).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if due.Before(sent.Add(payments.StaleAfterFor(0))) {
		t.Errorf("due %s after the send, before RegisterGrace (%s)", due.Sub(sent), payments.StaleAfterFor(0))
	}
	b.clock.Advance(11 * time.Second) // the schedule's step
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	held.Open()
	mustWait(t, wrapped.processed, "A's timed-out registration processed")
	b.clock.Set(due)
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if pays := b.gw.PaymentsWithReference(id); pays != 1 {
		t.Errorf("%d register calls, %d gateway payments: registered again while a timed-out registration could be in flight",
			b.gw.KeyCalls(fakegw.OpRegister, id), pays)
	}
}
