package payments_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// shortSchedule is a patrol schedule of three looks a second apart.
func shortSchedule(c *payments.Config) {
	c.Backoff = []time.Duration{time.Second, time.Second, time.Second}
}

// flaggedRefund refunds amount of s while the gateway fails every time, and drives the patrol
// until the schedule runs out: the refund is Pending, flagged, with a refund_unsettled case.
func (b *bench) flaggedRefund(t *testing.T, s payments.Session, amount int64, key string) payments.Refund {
	t.Helper()
	ctx := context.Background()
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 4) // the request and the schedule's three looks
	r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: amount, RequestKey: key})
	if err != nil || r.Refund.Status != payments.RefundPending {
		t.Fatalf("refund = %+v %v", r, err)
	}
	b.runOutRefundSchedule(t)
	got, err := b.svc.GetRefund(ctx, r.Refund.ID)
	if err != nil || got.FlaggedAt == nil || got.Status != payments.RefundPending {
		t.Fatalf("setup: %+v %v", got, err)
	}
	return got
}

// runOutRefundSchedule drives the patrol over Pending refunds past their grace and through the
// short schedule's looks: a refund the gateway does not settle ends flagged.
func (b *bench) runOutRefundSchedule(t *testing.T) {
	t.Helper()
	b.clock.Advance(payments.StaleAfterFor(0))
	for range 5 {
		if _, err := b.svc.DriveRefunds(context.Background()); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(time.Second)
	}
}

// A refund the gateway never settles: finance proposes Failed with the evidence, the proposer
// cannot approve it, a second person does. The refund is Failed (its feed event by staff, no
// ledger entry), unflagged, the case resolved, the money free to refund again; all audited.
func TestRefundOutcomeByHandFailed(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s := b.completed(t, "o-refund-by-hand", 1000)
	r := b.flaggedRefund(t, s, 600, "k")

	in := payments.RefundOutcomeInput{RefundID: r.ID, Outcome: payments.RefundFailed, Reason: "the gateway's support: never executed", Evidence: "ticket GW-77"}
	for _, bad := range []payments.RefundOutcomeInput{
		{RefundID: r.ID, Outcome: "Pending", Reason: "x", Evidence: "y"},
		{RefundID: r.ID, Outcome: payments.RefundFailed, Reason: " ", Evidence: "y"},
		{RefundID: r.ID, Outcome: payments.RefundFailed, Reason: "x", Evidence: ""},
	} {
		if _, err := b.svc.ProposeRefundOutcome(ctx, fin1, bad); payments.ErrorCode(err) != payments.EINVALID {
			t.Fatalf("proposal %+v = %v, want invalid", bad, err)
		}
	}
	p, err := b.svc.ProposeRefundOutcome(ctx, fin1, in)
	if err != nil || p.Kind != payments.ProposalRefundSettle || p.RefundID != r.ID || p.RefundOutcome != payments.RefundFailed || !p.Pending() {
		t.Fatalf("proposal = %+v, %v", p, err)
	}
	if _, err := b.svc.ProposeRefundOutcome(ctx, fin2, in); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("a second proposal while one waits = %v, want conflict", err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin1, p.ID); payments.ErrorCode(err) != payments.EFORBIDDEN {
		t.Fatalf("the proposer's approval = %v, want forbidden", err)
	}
	if got, _ := b.svc.GetRefund(ctx, r.ID); got.Status != payments.RefundPending {
		t.Fatalf("before the second person: %s", got.Status)
	}
	approved, err := b.svc.ApproveResolution(ctx, fin2, p.ID)
	if err != nil || approved.State != payments.ResolutionApproved {
		t.Fatalf("approval = %+v, %v", approved, err)
	}
	got, err := b.svc.GetRefund(ctx, r.ID)
	if err != nil || got.Status != payments.RefundFailed || got.FlaggedAt != nil {
		t.Fatalf("after approval: %+v, %v", got, err)
	}
	for sql, want := range map[string]int{
		`SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND $1 <> ''`:                                                                                  0,
		`SELECT count(*) FROM refund_events WHERE refund_id = $1 AND from_status = 'Pending' AND to_status = 'Failed' AND actor_kind = 'staff' AND actor_id = 'fin2@example.com'`: 1,
		`SELECT count(*) FROM refund_events WHERE refund_id = $1 AND from_status IS NULL AND actor_kind = 'api' AND actor_id = 'test-client'`:                                     1,
		`SELECT count(*) FROM finance_cases WHERE kind = 'refund_unsettled' AND resolved_at IS NULL AND $1 <> ''`:                                                                 0,
		`SELECT count(*) FROM audit_log WHERE action IN ('resolution.propose', 'resolution.approve') AND detail LIKE '%' || $1 || '%'`:                                            2,
	} {
		if n := b.count(t, sql, r.ID); n != want {
			t.Errorf("%s = %d, want %d", sql, n, want)
		}
	}
	// The money is free again: a refund of the whole amount goes through.
	if again, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 1000, RequestKey: "k2"}); err != nil || again.Refund.Status != payments.RefundSucceeded {
		t.Fatalf("refund after the Failed one = %+v, %v", again, err)
	}
}

// Succeeded by hand writes the one RefundIssued entry. While a proposal waits, "Retry now" is
// refused; a refund back with the patrol (no longer flagged) cannot be approved, nor one the
// gateway's answer settled since the proposal: the approval changes nothing and the proposal is
// rejected instead. A refund that is not flagged is not settled by hand.
// Negative controls (run by hand): without the retry's proposal check the retry goes through;
// without the approval's flag check the refund back with the patrol is settled Failed.
func TestRefundOutcomeByHandSucceededAndOvertaken(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s := b.completed(t, "o-refund-by-hand-ok", 1000)
	r := b.flaggedRefund(t, s, 300, "k1")
	p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r.ID, Outcome: payments.RefundSucceeded,
		Reason: "the bank statement shows it", Evidence: "statement 2026-11"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued' AND refund_id = $1 AND amount = 300`, r.ID); n != 1 {
		t.Fatalf("RefundIssued entries = %d", n)
	}
	if got, _ := b.svc.GetRefund(ctx, r.ID); got.Status != payments.RefundSucceeded {
		t.Fatalf("after approval: %s", got.Status)
	}

	// While a proposal waits, the refund is not sent back to the patrol: the gateway is not asked
	// while people decide its outcome.
	r2 := b.flaggedRefund(t, s, 200, "k2")
	p2, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r2.ID, Outcome: payments.RefundFailed,
		Reason: "looks lost", Evidence: "no trace in the dashboard"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.RetryFlaggedRefund(ctx, fin2, r2.ID); payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(err.Error(), "waits") {
		t.Fatalf("retry while a proposal waits = %v, want conflict", err)
	}
	// A refund no longer flagged (back with the patrol, which may be asking the gateway right
	// now) is not settled by hand: the approval is refused and changes nothing.
	if _, err := b.pool.Exec(ctx, `UPDATE refunds SET flagged_at = NULL, flag_reason = NULL, next_check_at = $2 WHERE id = $1`, r2.ID, b.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p2.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("approval of a refund back with the patrol = %v, want conflict", err)
	}
	if got, _ := b.svc.GetRefund(ctx, r2.ID); got.Status != payments.RefundPending {
		t.Fatalf("a refund back with the patrol was settled by hand: %s", got.Status)
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state = 'proposed'`, p2.ID); n != 1 {
		t.Fatal("the refused approval changed the proposal")
	}
	// Overtaken: the gateway's answer settles it; the proposal can then only be rejected.
	if n, err := b.svc.DriveRefunds(ctx); err != nil || n != 1 {
		t.Fatalf("the patrol's drive: %d, %v", n, err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p2.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("approval of an overtaken proposal = %v, want conflict", err)
	}
	if got, _ := b.svc.GetRefund(ctx, r2.ID); got.Status != payments.RefundSucceeded {
		t.Fatalf("the gateway's answer was overwritten: %s", got.Status)
	}
	if _, err := b.svc.RejectResolution(ctx, fin2, p2.ID, "the gateway answered"); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 2 {
		t.Fatalf("RefundIssued entries = %d, want 2 (one per refund)", n)
	}

	// Not flagged: the patrol still asks.
	b.gw.SetRefundOutcome("pending")
	pending, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 100, RequestKey: "k3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: pending.Refund.ID, Outcome: payments.RefundFailed,
		Reason: "x", Evidence: "y"}); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("proposal for a refund the patrol still asks about = %v, want conflict", err)
	}
}

// A refund the gateway knows by id but keeps pending until the schedule runs out is settled
// Failed by hand (four eyes), which frees its amount. Days later the gateway completes it after
// all. A new refund of that amount must not go out beside it (the customer would get both,
// within what the gateway's own captured-amount check allows, and the ledger would show one):
// the new refund asks the gateway about the refund settled by hand first, refuses (409), and
// notes it on the payment's gateway_mismatch case. Once the gateway says failed, the amount is
// free. Negative control: without the re-check the new refund goes through. (Found by a review
// of the ledger's invariants.)
func TestRefundAfterOneFailedByHandAsksTheGatewayAgain(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s := b.completed(t, "o-hand-failed", 1000)
	b.gw.SetRefundOutcome("pending")
	first, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k1"})
	if err != nil || first.Refund.GatewayRefundID == "" {
		t.Fatalf("refund = %+v %v", first, err)
	}
	b.runOutRefundSchedule(t)
	p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: first.Refund.ID, Outcome: payments.RefundFailed,
		Reason: "the gateway's support: never executed", Evidence: "ticket GW-78"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
		t.Fatal(err)
	}
	b.gw.SetRefundStatus(s.GatewayPaymentID, "succeeded") // days later, after all
	b.gw.SetRefundOutcome("succeeded")
	_, err = b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k2"})
	if payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("a new refund while the one settled Failed by hand succeeded at the gateway = %v, want conflict", err)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL
		AND detail LIKE '%settled Failed by hand%gateway says succeeded%'`, s.ID); n != 1 {
		t.Fatalf("open cases naming the refund = %d, want 1", n)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("refund requests at the gateway = %d, want the first one's 1", n)
	}
	b.gw.SetRefundStatus(s.GatewayPaymentID, "failed")
	if r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k3"}); err != nil || r.Refund.Status != payments.RefundSucceeded {
		t.Fatalf("once the gateway says failed: %+v %v", r, err)
	}
}

// A refund whose answer was lost (the gateway made it; we never learned its id) and whose
// schedule ran out is settled Failed by hand. A new refund of the payment asked the gateway only
// about refunds settled by hand that it knew by id, so this one was never asked about and the
// same amount went out beside it: the customer refunded twice, the ledger showing one (an
// outside review of money, found beside the late pending answer). Now the gateway is searched
// for it by our key first (FindRefund, making nothing): found, the new refund is refused, the
// gateway's id kept and finance told; not found (the lost request never reached the gateway),
// the new refund goes out. A gateway that cannot search (the reference gateway: "unsupported")
// leaves it unasked rather than refusing every refund of the payment for good. Negative control:
// only refunds with an id re-checked (as before), the made subtest's new refund succeeds and the
// gateway holds two.
func TestRefundAfterOneFailedByHandLooksForItByOurKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		made, noSearch bool
	}{{"the gateway made it", true, false}, {"it never arrived", false, false}, {"the gateway cannot search", false, true}} {
		made := tc.made
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mod := func(*payments.Config) {}
			if tc.noSearch {
				mod = func(c *payments.Config) { c.Gateway = noRefundSearch{c.Gateway} }
			}
			b := newBench(t, shortSchedule, mod)
			ctx := context.Background()
			s := b.completed(t, "o-hand-failed-no-id", 1000)
			first := fakegw.Transient
			if made {
				first = fakegw.LostAnswer
			}
			b.gw.Fail(fakegw.OpRefund, first, 1)
			b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 3) // the schedule's looks get no answer
			r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k1"})
			if err != nil || r.Refund.Status != payments.RefundPending || r.Refund.GatewayRefundID != "" {
				t.Fatalf("refund = %+v %v", r, err)
			}
			b.runOutRefundSchedule(t)
			p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r.Refund.ID, Outcome: payments.RefundFailed,
				Reason: "nothing in the gateway's dashboard", Evidence: "screenshot FIN-12"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.svc.ApproveResolution(ctx, fin2, p.ID); err != nil {
				t.Fatal(err)
			}
			wantAtGateway := map[bool]int{true: 1, false: 0}[made]
			if n := b.gw.Refunds(s.GatewayPaymentID); n != wantAtGateway {
				t.Fatalf("setup: gateway refunds = %d, want %d", n, wantAtGateway)
			}

			second, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 500, RequestKey: "k2"})
			if want := map[bool]int{false: 1, true: 0}[tc.noSearch]; b.gw.Calls(fakegw.OpFindRefund) != want {
				t.Errorf("searches by our key = %d, want %d", b.gw.Calls(fakegw.OpFindRefund), want)
			}
			if !made {
				if err != nil || second.Refund.Status != payments.RefundSucceeded || b.gw.Refunds(s.GatewayPaymentID) != 1 {
					t.Fatalf("nothing at the gateway, the new refund = %+v %v (gateway refunds %d), want it made", second, err, b.gw.Refunds(s.GatewayPaymentID))
				}
				return
			}
			if payments.ErrorCode(err) != payments.ECONFLICT {
				t.Fatalf("a new refund while the gateway holds the one settled Failed by hand = %+v %v, want conflict", second, err)
			}
			if n := b.gw.Refunds(s.GatewayPaymentID); n != 1 {
				t.Fatalf("the customer was refunded %d times at the gateway, want 1", n)
			}
			if got, _ := b.svc.GetRefund(ctx, r.Refund.ID); got.GatewayRefundID == "" || got.Status != payments.RefundFailed {
				t.Fatalf("the refund settled by hand: %s, gateway id %q; want Failed with the gateway's id kept", got.Status, got.GatewayRefundID)
			}
			if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL
				AND detail LIKE '%settled Failed by hand%gateway says succeeded%'`, s.ID); n != 1 {
				t.Fatalf("open cases naming the refund = %d, want 1", n)
			}
		})
	}
}

// noRefundSearch is a gateway that cannot search refunds, as the reference gateway's client.
type noRefundSearch struct{ payments.Gateway }

func (noRefundSearch) FindRefund(context.Context, string, string) (payments.GatewayRefund, bool, error) {
	return payments.GatewayRefund{}, false, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: "find_refund", Code: "unsupported"}
}

// Every refund event names who moved the refund, kind and id, as session_events do: the API
// client that claimed it, the replica whose patrol settled it (or the request that made it, when
// its own answer settled it), the person who approved an outcome by hand (above). They named the
// kind only, and which replica or client it was had to be pieced together elsewhere (an outside
// review of audit completeness; migration 00690). Negative control: actor_id not written, the
// rows carry ”.
func TestRefundEventsNameTheirActor(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s := b.completed(t, "o-refund-actor", 1000)
	direct, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 300, RequestKey: "k1"})
	if err != nil || direct.Refund.Status != payments.RefundSucceeded {
		t.Fatalf("refund = %+v %v", direct, err)
	}
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1) // the request's own send: no answer
	late, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 200, RequestKey: "k2"})
	if err != nil || late.Refund.Status != payments.RefundPending {
		t.Fatalf("refund = %+v %v", late, err)
	}
	b.clock.Advance(payments.StaleAfterFor(0))
	if n, err := b.svc.DriveRefunds(ctx); err != nil || n != 1 {
		t.Fatalf("the patrol drove %d: %v", n, err)
	}
	for _, tc := range []struct {
		refund, from, kind, id string
	}{
		{direct.Refund.ID, "", "api", "test-client"},
		{direct.Refund.ID, "Pending", "api", "test-client"}, // its own request's answer
		{late.Refund.ID, "", "api", "test-client"},
		{late.Refund.ID, "Pending", "sweeper", "replica-a"}, // the patrol of this replica
	} {
		if n := b.count(t, `SELECT count(*) FROM refund_events WHERE refund_id = $1 AND coalesce(from_status, '') = $2
			AND actor_kind = $3 AND actor_id = $4`, tc.refund, tc.from, tc.kind, tc.id); n != 1 {
			t.Errorf("events of refund %s from %q by %s:%s = %d, want 1", tc.refund, tc.from, tc.kind, tc.id, n)
		}
	}
}

// A refund_settle proposal whose refund the gateway has answered since can never be approved
// (approveRefundOutcome: "the gateway answered since the proposal"); it blocked every later
// proposal of the payment until someone rejected it by hand. The next proposal withdraws it,
// saying why, audited, as one the payment's status outran (noProposalWaiting). Negative
// control: without the refund's state in noProposalWaiting, the second proposal is refused.
func TestARefundOutcomeTheGatewayOutranGivesWayToTheNext(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s := b.completed(t, "o-refund-outran", 1000)
	r := b.flaggedRefund(t, s, 300, "k1")
	p, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r.ID, Outcome: payments.RefundFailed,
		Reason: "looks lost", Evidence: "no trace in the dashboard"})
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's answer settles it (as in TestRefundOutcomeByHandSucceededAndOvertaken).
	if _, err := b.pool.Exec(ctx, `UPDATE refunds SET flagged_at = NULL, flag_reason = NULL, next_check_at = $2 WHERE id = $1`, r.ID, b.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if n, err := b.svc.DriveRefunds(ctx); err != nil || n != 1 {
		t.Fatalf("the patrol's drive: %d, %v", n, err)
	}
	r2 := b.flaggedRefund(t, s, 200, "k2")
	p2, err := b.svc.ProposeRefundOutcome(ctx, fin2, payments.RefundOutcomeInput{RefundID: r2.ID, Outcome: payments.RefundFailed,
		Reason: "the gateway's support: never executed", Evidence: "ticket GW-78"})
	if err != nil || !p2.Pending() {
		t.Fatalf("a proposal beside one the gateway outran = %+v, %v", p2, err)
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state = 'rejected' AND decided_by = $2 AND decision_note LIKE '%is Succeeded since it was proposed%'`, p.ID, fin2.Email); n != 1 {
		t.Errorf("the outrun proposal #%d is not withdrawn by the next one's proposer, saying why", p.ID)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2 AND detail LIKE '#' || $3::text || ' %'`, payments.AuditResolutionReject, s.ID, fmt.Sprint(p.ID)); n != 1 {
		t.Errorf("%d audit entries of the withdrawal, want 1", n)
	}
	// The new one stands: it refuses the next.
	if _, err := b.svc.ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: r2.ID, Outcome: payments.RefundSucceeded,
		Reason: "x", Evidence: "y"}); payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(err.Error(), "already waits") {
		t.Fatalf("a proposal beside one that stands = %v, want conflict", err)
	}
	if _, err := b.svc.ApproveResolution(ctx, fin1, p2.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.svc.GetRefund(ctx, r2.ID); got.Status != payments.RefundFailed {
		t.Fatalf("the new proposal's approval: %s", got.Status)
	}
}
