package payments_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// (A review of the in-flight rule; negative control run by hand for each: without the fix, two
// gateway payments.) a Canceling session with no gateway payment: the patrol's driveReverse registers
// again (nothing found by reference), its registration times out (on the wire, still being
// processed). No hold is written (only drive's Unknown branch has holdForRegistration): the
// release gives it the schedule's step (10 s) and the next look finds nothing and registers
// beside it.
func TestACancelsPatrolRegistrationThatTimedOutIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-inflight-cancel-timeout", 1000).ID
	b.clock.Advance(time.Minute)
	ch, err := b.svc.RequestCancel(ctx, api, id)
	if err != nil {
		t.Fatal(err)
	}
	b.gw.Fail(fakegw.OpRegister, fakegw.Transient, 1) // the confirm's own drive: a 5xx, nothing in flight
	res, err := b.svc.ConfirmCancel(ctx, api, id, ch.ID, b.lastCode(t, id))
	if err != nil || res.Session.Status != payments.StatusCanceling {
		t.Fatalf("confirm = %s %v, want Canceling", res.Session.Status, err)
	}
	if pays := b.gw.PaymentsWithReference(id); pays != 0 {
		t.Fatalf("setup: %d payments", pays)
	}
	var due time.Time
	if err := b.pool.QueryRow(ctx, `SELECT next_check_at FROM payment_sessions WHERE id = $1`, id).Scan(&due); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(due)
	sent, held, processed := b.patrolRegistrationTimesOut(t, id)
	b.wantNoRegistrationBeside(t, id, sent, held, processed)
}

// (A review.) ConfirmCancel's own drive looks up by reference (slow: 9 s), then registers again;
// that registration times out while the gateway goes on processing it. The patrol's first look
// is due at commit + cancelGrace (RegisterGrace from the commit, not from the send), no hold is
// written for the send, and the patrol finds nothing yet and registers beside it.
func TestAConfirmsOwnLateRegistrationIsNotSentAgainBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-inflight-confirm-late", 1000).ID
	b.clock.Advance(time.Minute)
	ch, err := b.svc.RequestCancel(ctx, api, id)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, id)
	wrapped := &timesOutGateway{Gateway: b.gw, processed: make(chan struct{})}
	a := b.service(b.pool, "replica-a2", func(c *payments.Config) { c.Gateway = wrapped })
	find := b.gw.Hold(fakegw.OpFind)
	reg := b.gw.Hold(fakegw.OpRegister)
	type res struct {
		r   payments.ConfirmResult
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := a.ConfirmCancel(ctx, api, id, ch.ID, code)
		done <- res{r, err}
	}()
	mustWait(t, find.Arrived(), "the confirm's look-up by reference")
	b.gw.Unhold(fakegw.OpFind)
	b.clock.Advance(9 * time.Second) // a slow search, inside its timeout
	find.Open()
	mustWait(t, reg.Arrived(), "the confirm's registration at the gateway")
	sent := b.clock.Now()
	b.gw.Unhold(fakegw.OpRegister)
	r := mustWait(t, done, "the confirm to answer")
	if r.err != nil || r.r.Session.Status != payments.StatusCanceling {
		t.Fatalf("confirm = %s %v, want Canceling", r.r.Session.Status, r.err)
	}
	b.wantNoRegistrationBeside(t, id, sent, reg, wrapped.processed)
}

// (A review.) the patrol's last look at an Unknown payment registers again (nothing found) and
// the registration times out: holdForRegistration writes next_check_at, but the release flags
// the session (schedule run out) and the flag clears next_check_at; finance's "Retry now"
// makes it due now with nothing remembering the registration in flight, and the next look
// registers beside it.
func TestRetryNowInsideARegistrationsGraceDoesNotRegisterBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-inflight-retry-now", 1000).ID
	b.clock.Advance(5 * time.Minute)
	// The schedule's last look (one step here, for brevity; the default's is the 17th).
	sent, held, processed := b.patrolRegistrationTimesOut(t, id, func(c *payments.Config) { c.Backoff = []time.Duration{5 * time.Second} })
	s, err := b.svc.Get(ctx, id)
	if err != nil || s.FlaggedAt == nil {
		t.Fatalf("setup: %+v %v, want flagged", s, err)
	}
	b.clock.Advance(5 * time.Second) // finance sees the flag and clicks "Retry now"
	if _, err := b.svc.RetryFlagged(ctx, fin1, id); err != nil {
		t.Fatal(err)
	}
	b.wantNoRegistrationBeside(t, id, sent, held, processed)
}

// wantNoRegistrationBeside checks that the registration of session id sent at sent, held at the
// gateway (held) and still processed after its sender gave up, has nothing sent beside it: the
// session is due no earlier than RegisterGrace after the send, a patrol round just before then
// sends nothing, and once the held request is processed (processed) the round at the due time
// finds it by reference: one gateway payment.
func (b *bench) wantNoRegistrationBeside(t *testing.T, id string, sent time.Time, held *fakegw.Gate, processed <-chan struct{}) {
	t.Helper()
	ctx := context.Background()
	grace := sent.Add(payments.StaleAfterFor(0))
	var due time.Time
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(next_check_at, 'infinity') FROM payment_sessions WHERE id = $1`, id).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if due.Before(grace) {
		t.Errorf("due %s after the send, before RegisterGrace (%s)", due.Sub(sent), payments.StaleAfterFor(0))
	}
	if before := grace.Add(-time.Second); before.After(b.clock.Now()) {
		b.clock.Set(before)
	}
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	held.Open() // the gateway finishes the request its sender gave up on
	mustWait(t, processed, "the registration in flight processed")
	if due.After(b.clock.Now()) && due.Before(grace.Add(time.Hour)) {
		b.clock.Set(due)
	}
	if _, err := b.svc.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if pays := b.gw.PaymentsWithReference(id); pays != 1 {
		t.Errorf("%d register calls, %d gateway payments: registered again while a registration could be in flight",
			b.gw.KeyCalls(fakegw.OpRegister, id), pays)
	}
}

// Retry now right after the schedule's last look got a proxy's 504 for its re-registration: the
// hold was cleared by the flag, and registrationInFlight counted only calls with no answer at all
// (a review: the call log's rule and mayBeInFlight disagreed). Negative control (run by hand):
// with http_status IS NULL alone, two payments.
func TestRetryNowAfterA504RegistrationDoesNotRegisterBesideIt(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	b.gw.IgnoreKeys(true)
	id := b.unregistered(t, "o-inflight-504-retry", 1000).ID
	b.clock.Advance(5 * time.Minute)
	wrapped := &timesOutGateway{Gateway: b.gw, processed: make(chan struct{}), status: 504}
	a := b.service(b.pool, "replica-a2", func(c *payments.Config) { c.Gateway = wrapped; c.Backoff = []time.Duration{5 * time.Second} })
	held := b.gw.Hold(fakegw.OpRegister)
	sent := b.clock.Now()
	if _, err := a.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	mustWait(t, held.Arrived(), "A's registration at the gateway")
	b.gw.Unhold(fakegw.OpRegister)
	s, err := b.svc.Get(ctx, id)
	if err != nil || s.FlaggedAt == nil {
		t.Fatalf("setup: %+v %v, want flagged", s, err)
	}
	b.clock.Advance(5 * time.Second)
	if _, err := b.svc.RetryFlagged(ctx, fin1, id); err != nil {
		t.Fatal(err)
	}
	b.wantNoRegistrationBeside(t, id, sent, held, wrapped.processed)
}

// Create's registration answered 504 by a proxy (the upstream goes on): Unknown, due at
// RegisterGrace from the send. A cancel confirmed inside that grace leaves the reverse to the
// patrol (it missed the 504, found nothing by reference and registered beside the one in
// flight: a review). A 408 (a proxy that gave up waiting, as refgw and stripegw read it) alike
// (a review of the rule: it was unknown, not in flight; negative control by hand: two payments).
func TestACancelAfterA504CreateDoesNotRegisterBesideIt(t *testing.T) {
	t.Parallel()
	for _, status := range []int{504, 408, 524} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			b := newBench(t)
			b.reconcileElsewhere(t)
			ctx := context.Background()
			b.gw.IgnoreKeys(true)
			wrapped := &timesOutGateway{Gateway: b.gw, processed: make(chan struct{}), status: status}
			a := b.service(b.pool, "replica-a2", func(c *payments.Config) { c.Gateway = wrapped })
			held := b.gw.Hold(fakegw.OpRegister)
			r, err := a.Create(ctx, api, payments.CreateInput{OrderID: "o-inflight-cancel", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
			if err != nil || r.Session.Status != payments.StatusUnknown {
				t.Fatalf("setup: %+v %v, want Unknown", r.Session, err)
			}
			id := r.Session.ID
			mustWait(t, held.Arrived(), "Create's registration at the gateway")
			b.gw.Unhold(fakegw.OpRegister)
			b.clock.Advance(5 * time.Second)
			ch, err := b.svc.RequestCancel(ctx, api, id)
			if err != nil {
				t.Fatal(err)
			}
			res, err := b.svc.ConfirmCancel(ctx, api, id, ch.ID, b.lastCode(t, id))
			t.Logf("confirm = %s %v", res.Session.Status, err)
			held.Open()
			mustWait(t, wrapped.processed, "the registration in flight processed")
			if pays := b.gw.PaymentsWithReference(id); pays != 1 {
				t.Errorf("%d register calls, %d gateway payments: the cancel registered beside a %d'd registration still in flight",
					b.gw.KeyCalls(fakegw.OpRegister, id), pays, status)
			}
		})
	}
}

// A session whose registration timed out but was then found by reference (it has its gateway
// id: nothing can be registered again) is flagged; Retry now makes it due now, not
// RegisterGrace after the timed-out send (a review).
func TestRetryNowOfARegisteredPaymentIsDueNow(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	b.reconcileElsewhere(t)
	ctx := context.Background()
	wrapped := &timesOutGateway{Gateway: b.gw, processed: make(chan struct{})}
	a := b.service(b.pool, "replica-a2", func(c *payments.Config) { c.Gateway = wrapped })
	r, err := a.Create(ctx, api, payments.CreateInput{OrderID: "o-inflight-retry-registered", Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil || r.Session.Status != payments.StatusUnknown {
		t.Fatalf("setup: %+v %v, want Unknown", r.Session, err)
	}
	id := r.Session.ID
	mustWait(t, wrapped.processed, "the registration processed")
	s, err := b.svc.Check(ctx, api, id)
	if err != nil || s.GatewayPaymentID == "" {
		t.Fatalf("setup: check = %+v %v, want found by reference", s, err)
	}
	b.exec(t, `UPDATE payment_sessions SET flagged_at = now(), flag_reason = 'test flag', next_check_at = NULL WHERE id = $1`, id)
	b.clock.Advance(time.Second)
	out, err := b.svc.RetryFlagged(ctx, fin1, id)
	if err != nil {
		t.Fatal(err)
	}
	if out.NextCheckAt == nil || out.NextCheckAt.After(b.clock.Now()) {
		t.Errorf("Retry now of a payment with gateway id %s: due %v, now %v (held for a registration that cannot matter)", out.GatewayPaymentID, out.NextCheckAt, b.clock.Now())
	}
}
