package handlers_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// One Idempotency-Key, one refund, also when a request refused after taking the key over from a
// slow holder frees it. A keyed refund whose first request is still running before its claim
// (here: its re-check of a refund settled Failed by hand waits for a slow gateway; under load, a
// pool that has no free connection does the same) past StaleAfter (30 s; the request bound is
// 55 s) is taken over by the same request sent again. The taker-over is refused 409 (a Pending
// refund still holds the room) and giveUp RELEASES the client key: the row is deleted. The first
// request then claims and makes refund R under the old use (Since S); the client, told 409 and
// free to use its key again, sends the same request once the Pending refund failed: a fresh use
// (Since S'), a new RequestKey, and a second refund R' of the same amount. One Idempotency-Key,
// two refunds at the gateway, the customer refunded twice (an outside review). A key taken over
// from a stale holder is abandoned on such a refusal: the same request takes the use over and
// finds R. Negative control: releasing it (giveUp without !slot.Fresh) makes the two refunds;
// releasing a key taken over from no holder (slot.TookOver alone) makes them after two retries.
func TestAKeyTakenOverAndRefusedStaysWithItsSlowFirstRequest(t *testing.T) {
	t.Parallel()
	b := newAPIBench(t)
	pay := b.completedPayment(t, "o-audit-release", 1000)

	// F: a refund settled Failed by hand (no gateway id: the re-check looks for it by our key).
	b.gw.Fail(fakegw.OpRefund, fakegw.Definitive, 1)
	f := wantRefund(t, b.do(post(refundsPath(pay.ID), `{"amount":100}`, "Idempotency-Key", "f")), http.StatusCreated)
	if _, err := b.pool.Exec(context.Background(), `UPDATE refunds SET detail = 'settled by hand: audit' WHERE id = $1`, f.ID); err != nil {
		t.Fatal(err)
	}
	// P: 700 pending at the gateway; it holds the room (300 left).
	b.gw.SetRefundOutcome("pending")
	wantRefund(t, b.do(post(refundsPath(pay.ID), `{"amount":700}`, "Idempotency-Key", "p")), http.StatusAccepted)
	b.gw.SetRefundOutcome("succeeded")

	// K1: refund 500 with key k; it stops in its re-check (before the claim), at the gateway.
	gate := b.gw.Hold(fakegw.OpFindRefund)
	defer gate.Open()
	c := post(refundsPath(pay.ID), `{"amount":500}`, "Idempotency-Key", "k")
	k1 := b.goDo(b.e, c)
	mustWait(t, gate.Arrived(), "K1 in its re-check")
	b.gw.Unhold(fakegw.OpFindRefund) // later re-checks pass; K1 stays held

	// K2: the client's retry after K1's lock went stale: a takeover, refused 409 (room). And its
	// retry again (a 409 invites one): the key K2 gave up has no holder, and taking it is no
	// different (the same review's second look: it was released then).
	b.clock.Advance(payments.StaleAfterFor(0) + time.Second)
	wantProblem(t, b.do(c), http.StatusConflict, "")
	wantProblem(t, b.do(c), http.StatusConflict, "")
	if n := b.count(t, `SELECT count(*)::int FROM idempotency_keys WHERE key = 'k'`); n != 1 {
		t.Errorf("key k rows after two refused retries = %d, want 1 (still bound to the slow first request's use)", n)
	}

	// P fails at the gateway; the patrol settles it: the room is back.
	b.gw.SetRefundStatus(*pay.GatewayPaymentID, "failed")
	if _, err := b.svc.DriveRefunds(context.Background()); err != nil {
		t.Fatal(err)
	}

	// K1 goes on: claims and refunds 500.
	gate.Release()
	r1 := wantRefund(t, mustWait(t, k1, "K1"), http.StatusCreated)

	// K3: the client sends its refund again with the same key (its last answer was a 409).
	rec := b.do(c)
	r3 := wantRefund(t, rec, rec.Code)
	if r3.ID != r1.ID {
		t.Errorf("the same Idempotency-Key made two refunds: %s (first request) and %s (its retry), status %d replayed %q",
			r1.ID, r3.ID, rec.Code, rec.Header().Get("Idempotent-Replayed"))
	}
	if n := b.count(t, `SELECT count(*)::int FROM refunds WHERE session_id = $1 AND amount = 500 AND status = 'Succeeded'`, pay.ID); n != 1 {
		t.Errorf("succeeded refunds of 500 for key k = %d, want 1", n)
	}
	if n := b.count(t, `SELECT coalesce(sum(amount),0)::int FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 500 {
		t.Errorf("refunded in the ledger = %d, want 500", n)
	}
}
