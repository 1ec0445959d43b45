package payments_test

import (
	"context"
	"testing"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// A payment the gateway answered about for another amount (flagged, an open gateway_mismatch
// case) is finance's: a cancel is refused (409) before any code is sent, and a code sent before
// the mismatch was found is refused too, unspent, with no reverse at the gateway. Confirmed, the
// reverse's answer could never be applied (the same mismatch) and the payment stayed Canceling
// for good; with the customer paying at the bank meanwhile the confirm answered 202 "Canceling"
// for money captured (an outside review, cancels). Negative control (run by hand): without
// mismatchRefusal the code is sent, and the confirm answers Canceling.
func TestACancelOfAPaymentTheGatewayContradictsIsRefused(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-cancel-mismatch", 1000)
	early, err := b.svc.RequestCancel(ctx, api, s.ID) // before the mismatch is known
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, s.ID)
	b.gw.SetAmount(s.GatewayPaymentID, 900, "EUR")
	if _, err := b.svc.Check(ctx, api, s.ID); err != nil {
		t.Fatal(err)
	}
	b.afterMismatch(t, s, payments.StatusRegistered)
	messages := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, s.ID)

	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded) // the customer pays at the bank
	res, err := b.svc.ConfirmCancel(ctx, api, s.ID, early.ID, code)
	if payments.ErrorCode(err) != payments.ECONFLICT {
		t.Errorf("the earlier code's confirm = %s %v, want conflict", res.Session.Status, err)
	}
	if _, err := b.svc.RequestCancel(ctx, api, s.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Errorf("a cancel request = %v, want conflict", err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, s.ID); n != messages {
		t.Errorf("messages = %d, want %d: no code sent", n, messages)
	}
	got, _ := b.plain.Get(ctx, s.ID)
	if got.Status != payments.StatusRegistered || got.FlaggedAt == nil {
		t.Errorf("payment = %s (flagged %v), want Registered and flagged as it was", got.Status, got.FlaggedAt != nil)
	}
	for sql, want := range map[string]int{
		`SELECT count(*) FROM reverse_operations WHERE session_id = $1`:                            0,
		`SELECT count(*) FROM cancel_challenges WHERE session_id = $1 AND consumed_at IS NOT NULL`: 0,
		`SELECT count(*) FROM code_wrong_guesses WHERE session_id = $1`:                            0,
	} {
		if n := b.count(t, sql, s.ID); n != want {
			t.Errorf("%s = %d, want %d", sql, n, want)
		}
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 0 {
		t.Errorf("reverse calls = %d, want 0", n)
	}
}

// The same once finance resolved the case with a note but did not settle the payment: the flag
// the mismatch raised is still on it, the gateway still contradicts it, and a cancel confirmed
// then stayed Canceling for good with no open case (a review of the rule above).
func TestACancelOfAPaymentFlaggedForAResolvedMismatchIsRefused(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-cancel-mismatch-resolved", 1000)
	b.capturedAtAnotherAmount(t, s, 900, payments.GatewaySucceeded)
	b.resolveOpenCase(t, s.ID, payments.CaseGatewayMismatch, "looked at it, ticket FIN-1")
	if _, err := b.svc.RequestCancel(ctx, api, s.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Errorf("a cancel request = %v, want conflict", err)
	}
	if n := b.gw.Calls(fakegw.OpReverse); n != 0 {
		t.Errorf("reverse calls = %d, want 0", n)
	}
}

// A flag keeps its first reason: flagged by the patrol's schedule before the gateway
// contradicted it, then the mismatch case resolved without settling — the cancel is refused all
// the same (matched by the flag's reason, it went through: a review of the rule above).
func TestACancelOfAPaymentFlaggedBeforeItsMismatchIsRefused(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.registered(t, "o-cancel-flag-first", 1000)
	b.exec(t, `UPDATE payment_sessions SET flagged_at = now(), flag_reason = 'no final answer from the gateway after 12 looks; still Registered', next_check_at = NULL WHERE id = $1`, s.ID)
	b.capturedAtAnotherAmount(t, s, 900, payments.GatewaySucceeded)
	b.resolveOpenCase(t, s.ID, payments.CaseGatewayMismatch, "looked at it, ticket FIN-1")
	if _, err := b.svc.RequestCancel(ctx, api, s.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Errorf("a cancel request = %v, want conflict", err)
	}
}

// capturedAtAnotherAmount has the gateway answer about s, a Registered payment, for amount (EUR)
// in status st, and a Check apply it: s stays Registered, flagged, with a gateway_mismatch case.
func (b *bench) capturedAtAnotherAmount(t *testing.T, s payments.Session, amount int64, st payments.GatewayStatus) {
	t.Helper()
	b.gw.SetAmount(s.GatewayPaymentID, amount, "EUR")
	b.gw.SetStatus(s.GatewayPaymentID, st)
	if _, err := b.svc.Check(context.Background(), api, s.ID); err != nil {
		t.Fatal(err)
	}
	b.afterMismatch(t, s, payments.StatusRegistered)
}
