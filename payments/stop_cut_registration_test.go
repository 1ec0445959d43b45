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
	id, sent, held, processed := b.createCutByTheStop(t, "o-stop-cut-create")
	b.wantNoRegistrationBeside(t, id, sent, held, processed)
}

// createCutByTheStop makes an API Create at a gateway that ignores keys whose registration is on
// the wire (held) when the replica's stop cuts the request a second later: the gateway goes on
// processing it (processed closes when it has). It returns the session's id and when its
// registration was sent.
func (b *bench) createCutByTheStop(t *testing.T, orderID string) (id string, sent time.Time, held *fakegw.Gate, processed <-chan struct{}) {
	t.Helper()
	b.reconcileElsewhere(t)
	b.gw.IgnoreKeys(true)
	wrapped := &goesOnGateway{Gateway: b.gw, processed: make(chan struct{})}
	a := b.service(b.pool, "replica-stopping", func(c *payments.Config) { c.Gateway = wrapped })
	held = b.gw.Hold(fakegw.OpRegister)
	rctx, cut := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	sent = b.clock.Now()
	go func() {
		_, err := a.Create(rctx, api, payments.CreateInput{OrderID: orderID, Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
		done <- err
	}()
	id = mustWait(t, held.Arrived(), "the Create's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	b.clock.Advance(time.Second)
	cut(errors.New("the replica is stopping")) // the stop's grace ran out: requests cut with a cause
	if err := mustWait(t, done, "the Create to answer"); err != nil {
		t.Fatalf("the cut Create answered %v, want its session (Unknown)", err)
	}
	return id, sent, held, wrapped.processed
}

// A cancel confirmed inside a cut Create's grace leaves the reverse to the patrol once the cut
// registration can no longer be in flight: the confirm's own drive found nothing by reference
// and registered again beside it (an outside review of the rule above). Negative control (run by
// hand): without registrationInFlight, two payments.
func TestACancelInsideACutCreatesGraceDoesNotRegisterBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	id, _, held, processed := b.createCutByTheStop(t, "o-cut-then-cancel")
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
	mustWait(t, processed, "the cut registration processed")
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
// GATEWAY_TIMEOUT; with status, a proxy in front of it answering that, 502 or 504) while the
// gateway goes on processing it.
type timesOutGateway struct {
	*fakegw.Gateway
	processed chan struct{}
	status    int
}

func (g *timesOutGateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	go func() {
		_, _ = g.Gateway.Register(context.WithoutCancel(ctx), req)
		close(g.processed)
	}()
	return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureUnknown, Op: "register", HTTPStatus: g.status, Err: context.DeadlineExceeded}
}

// A patrol drive's registration given up at its own timeout is as much on the wire as one cut
// by the stop: the next look waits RegisterGrace from its send (it was due at the schedule's
// step, 10 s, and registered beside it: a review of the rule above). Negative control (run by
// hand): without holdForRegistration, two payments.
func TestAPatrolRegistrationThatTimedOutIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-timeout-register", 1000).ID
	b.clock.Advance(5 * time.Minute)
	sent, held, processed := b.patrolRegistrationTimesOut(t, id)
	b.wantNoRegistrationBeside(t, id, sent, held, processed)
}

// patrolRegistrationTimesOut runs a patrol round of another replica whose registration of
// session id is given up at its own timeout while the gateway (held) goes on processing it; mod
// changes that replica's configuration. It returns when the registration was sent.
func (b *bench) patrolRegistrationTimesOut(t *testing.T, id string, mod ...func(*payments.Config)) (sent time.Time, held *fakegw.Gate, processed <-chan struct{}) {
	t.Helper()
	wrapped := &timesOutGateway{Gateway: b.gw, processed: make(chan struct{})}
	a := b.service(b.pool, "replica-a2", append([]func(*payments.Config){func(c *payments.Config) { c.Gateway = wrapped }}, mod...)...)
	held = b.gw.Hold(fakegw.OpRegister)
	sent = b.clock.Now()
	if _, err := a.SweepOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustWait(t, held.Arrived(), "A's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	return sent, held, wrapped.processed
}
