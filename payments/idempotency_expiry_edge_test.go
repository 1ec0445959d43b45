package payments_test

import (
	"context"
	"testing"
	"time"

	"pitlane/payments"
)

// A client key whose stale request is taken over just before the key's 30-day TTL ends is in
// flight again; an identical request at the TTL's edge (− 1 ns, at it, + 1 ns) while that takeover
// still runs is told 409 (the contract: "the same key while its first request still runs"). It was
// handed a fresh use of the key (a new Since: a second refund under a new RequestKey while the
// first was still at the gateway; a review of time windows). Negative control (run by hand):
// live by expires_at alone and no keyLivesOn (either holds it), a fresh slot at the TTL.
func TestAKeyTakenOverAtItsExpiryIsStillBusy(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	stale := payments.StaleAfterFor(10 * time.Second)
	ttl := payments.DefaultIdempotencyTTL
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{StaleAfter: stale, TTL: ttl})
	r := idemReq(cl.ID, "refund-k", `{"amount":100}`)
	crashed, err := x.Acquire(ctx, r) // T0: first use, its request dies (nothing completes it)
	if err != nil || !crashed.Fresh {
		t.Fatalf("first = %+v %v", crashed, err)
	}
	// The client's retry queue sends it again one second before the key's TTL ends: a takeover.
	b.clock.Set(t0.Add(ttl - time.Second))
	taken, err := x.Acquire(ctx, r)
	if err != nil || !taken.TookOver {
		t.Fatalf("retry before the TTL = %+v %v, want a takeover", taken, err)
	}
	// That takeover's effect is at the gateway (in flight for up to StaleAfter). Identical
	// retries arrive at the TTL − 1 ns, at the TTL, and at the TTL + 1 ns.
	for _, at := range []time.Duration{ttl - time.Nanosecond, ttl, ttl + time.Nanosecond} {
		b.clock.Set(t0.Add(at))
		s, err := x.Acquire(ctx, r)
		if payments.ErrorCode(err) != payments.EBUSY {
			t.Errorf("identical request at T0+TTL%+v while the takeover (locked until T0+TTL-1s+%s) still runs = slot{Fresh:%v Token:%v Since:%s} err=%v; want EBUSY (409). "+
				"A fresh use has Since %s != the takeover's %s: the API refund handler derives a new RequestKey from it (refundRequestKey) → a second refund",
				at-ttl, stale, s.Fresh, s.Token != "", s.Since.Format(time.RFC3339Nano), err, s.Since.Format(time.RFC3339Nano), taken.Since.Format(time.RFC3339Nano))
			return
		}
	}
}

// The same edge end to end as the API's refund handler runs it (Idempotency.Run around
// CreateRefund, RequestKey = client/kind/key/Since): one Idempotency-Key made two refunds.
func TestARefundKeyTakenOverAtItsExpiryRefundsOnce(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	sess := b.completed(t, "o-refund-edge", 1000)
	ttl := payments.DefaultIdempotencyTTL
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{StaleAfter: payments.StaleAfterFor(10 * time.Second), TTL: ttl})
	path := "/api/v1/payments/" + sess.ID + "/refunds"
	r := payments.IdempotencyRequest{ClientID: cl.ID, Kind: payments.IdempotencyClientKey, Key: "refund-once",
		Method: "POST", Path: path, Fingerprint: payments.Fingerprint("POST", path, []byte(`{"amount":100}`))}
	effect := func(gate <-chan struct{}, entered chan<- struct{}) payments.Effect {
		return func(ctx context.Context, slot payments.Slot) (string, int, error) {
			if entered != nil {
				close(entered)
			}
			if gate != nil {
				<-gate
			}
			key := r.ClientID + "/" + string(r.Kind) + "/" + r.Key + "/" + slot.Since.UTC().Format(time.RFC3339Nano) // handlers.refundRequestKey
			res, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: sess.ID, Amount: 100, RequestKey: key, Bind: slot.Binding})
			return res.Refund.ID, 201, err
		}
	}
	b.clock.Set(t0)
	if _, err := x.Acquire(ctx, r); err != nil { // the first request dies holding the key
		t.Fatal(err)
	}
	b.clock.Set(t0.Add(ttl - time.Second)) // its retry, 1 s before the key's TTL ends: a takeover
	gate, entered := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() { _, err := x.Run(ctx, r, effect(gate, entered)); first <- err }()
	mustWait(t, entered, "the takeover's effect")
	b.clock.Set(t0.Add(ttl)) // another retry of the same request, at the TTL, while the first still runs
	_, err := x.Run(ctx, r, effect(nil, nil))
	close(gate)
	if ferr := mustWait(t, first, "the takeover"); ferr != nil {
		t.Fatalf("takeover: %v", ferr)
	}
	n := b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1`, sess.ID)
	if payments.ErrorCode(err) != payments.EBUSY || n != 1 {
		t.Fatalf("second request at the key's TTL while its takeover ran = %v; refunds made under one Idempotency-Key = %d, want 409 and 1", err, n)
	}
}

// A use taken over or completed just before the key's TTL ends lives keyAfterUse past that: the
// takeover's own lock going stale a second after the TTL is taken over again (the same use, its
// Since: the effect finds what it made), and a request whose answer was lost a second before the
// TTL replays it a second after. Both were a fresh use. Negative control (run by hand): without
// keyLivesOn, a fresh slot each time.
func TestAKeyUsedAtItsExpiryLivesOnForItsRetries(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	cl := newClient(t, b, "shop")
	stale := payments.StaleAfterFor(10 * time.Second)
	ttl := payments.DefaultIdempotencyTTL
	x := payments.NewIdempotency(b.svc, payments.IdempotencyConfig{StaleAfter: stale, TTL: ttl})

	r := idemReq(cl.ID, "taken-over-at-expiry", `{"amount":100}`)
	b.clock.Set(t0)
	if _, err := x.Acquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(t0.Add(ttl - time.Second))
	taken, err := x.Acquire(ctx, r)
	if err != nil || !taken.TookOver {
		t.Fatalf("retry before the TTL = %+v %v, want a takeover", taken, err)
	}
	b.clock.Set(t0.Add(ttl - time.Second + stale + time.Second)) // the takeover died too
	again, err := x.Acquire(ctx, r)
	if err != nil || again.Fresh || !again.Since.Equal(taken.Since) {
		t.Fatalf("retry after the takeover's lock went stale past the TTL = %+v %v; want the same use (Since %s) taken over", again, err, taken.Since)
	}

	r = idemReq(cl.ID, "completed-at-expiry", `{"amount":100}`)
	b.clock.Set(t0)
	first, err := x.Acquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Set(t0.Add(ttl - time.Second))
	if err := x.Complete(ctx, r, first.Token, "00000000-0000-0000-0000-000000000001", 201); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(t0.Add(ttl + time.Second)) // its answer was lost; the client retries
	if replay, err := x.Acquire(ctx, r); err != nil || !replay.Done {
		t.Fatalf("retry a second after the TTL of a request completed a second before it = %+v %v; want its replay", replay, err)
	}
}
