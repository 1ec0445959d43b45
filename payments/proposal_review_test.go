package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/bcrypt"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// TestAShopRefundStampedBeforeTheProposalStopsItsApproval: the shop's API refund is made after
// the refund proposal was filed (and committed), on another replica whose clock reads half a
// second behind the proposer's (the same happens on one replica when the shop's refund read its
// time before waiting for the order lock the proposal held). Compared by time, its created_at
// was before proposed_at and the proposal's 6.00 was paid out beside the shop's 4.00 for the
// same complaint (a review of TestAShopRefundSinceTheProposalStopsItsApproval's rule). The
// proposal remembers the refunds it saw (migration 00980).
func TestAShopRefundStampedBeforeTheProposalStopsItsApproval(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	s := b.completed(t, "o-probe-skew", 1000)
	b.clock.Advance(time.Minute)
	p, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 600, uuid.NewString()))
	if err != nil || p.Proposal == nil {
		t.Fatalf("proposal = %+v %v", p, err)
	}
	// Replica B, its clock 500 ms behind replica A's; the shop's refund arrives after the proposal.
	behind := payments.NewManualClock(b.clock.Now().Add(-500 * time.Millisecond))
	shop := b.service(b.pool, "replica-b", eurLimit, func(c *payments.Config) { c.Clock = behind })
	if r, err := shop.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "shop-refund"}); err != nil || !r.Created {
		t.Fatalf("the shop's refund = %+v %v", r, err)
	}
	b.clock.Advance(time.Minute)
	calls := b.gw.Calls(fakegw.OpRefund)
	_, err = b.svc.ApproveResolution(ctx, finance2, p.Proposal.ID)
	if payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("approval after the shop's refund (made after the proposal, stamped 500 ms before it) = %v; %d more refund call(s) to the gateway, refunds %d of 1000",
			err, b.gw.Calls(fakegw.OpRefund)-calls,
			b.count(t, `SELECT coalesce(sum(amount), 0)::int FROM refunds WHERE session_id = $1 AND status <> 'Failed'`, s.ID))
	}
}

// TestEnableWithdrawsAProposalTheDisableSkipped: a proposal the disable's withdrawal skipped
// (FOR UPDATE SKIP LOCKED: a second person's approval held its row, waiting on the session's
// case that a resolve held, and then failed) stays 'proposed'; while its proposer is disabled
// the approval guard refuses it, and EnableUser lifted that guard: the proposal filed before the
// offboarding was approved (a review of the enable). The enable withdraws it.
func TestEnableWithdrawsAProposalTheDisableSkipped(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	acc, cli, _, p := proposalTheDisableSkipped(t, b, "o-probe-skipped")
	if state := b.texts(t, `SELECT state FROM resolution_proposals WHERE id = $1`, p.ID); len(state) != 1 || state[0] != "proposed" {
		t.Fatalf("setup: after the disable, proposal #%d is %v, want still proposed (skipped)", p.ID, state)
	}

	// The disable was a mistake: enabled again.
	if _, err := acc.EnableUser(ctx, cli, fin1.Email); err != nil {
		t.Fatal(err)
	}
	if got := b.texts(t, `SELECT state FROM resolution_proposals WHERE id = $1`, p.ID); len(got) != 1 || got[0] != "rejected" {
		t.Errorf("the skipped proposal after the enable: %v, want rejected (withdrawn)", got)
	}
	r, err := b.svc.ApproveResolution(ctx, fin2, p.ID)
	if err == nil {
		t.Fatalf("a proposal filed before fin1's disable (which withdraws her proposals) was approved after the enable: #%d %s, payment %s",
			r.ID, r.State, r.SessionStatus)
	}
}

// proposalTheDisableSkipped makes fin1's proposal to settle a flagged payment of order by hand,
// and disables fin1 while fin2's approval holds the proposal's row (it waits for the session's
// case, which a resolve holds), so the disable's withdrawal skips it (SKIP LOCKED); the approval
// then gives up (a closed tab) and rolls back. The proposal is left waiting, its proposer
// disabled.
func proposalTheDisableSkipped(t *testing.T, b *bench, order string) (*access.Service, payments.Staff, payments.Session, payments.Resolution) {
	t.Helper()
	ctx := context.Background()
	acc := access.New(b.pool, b.clock)
	acc.PasswordCost = bcrypt.MinCost
	cli := payments.Staff{Email: "cli:root", Role: "admin"}
	for _, u := range []payments.Staff{fin1, fin2} {
		if _, err := acc.CreateUser(ctx, cli, u.Email, access.RoleFinance, "a long enough password"); err != nil {
			t.Fatal(err)
		}
	}
	s := b.flagged(t, order, 1000)
	p := b.propose(t, fin1, s.ID, payments.StatusFailed)
	// Another finance user resolving the session's case holds its row (ResolveCase's UPDATE).
	resolve, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer resolve.Rollback(ctx) //nolint:errcheck
	if _, err := resolve.Exec(ctx, `UPDATE finance_cases SET resolution = 'x' WHERE session_id = $1`, s.ID); err != nil {
		t.Fatal(err)
	}
	// fin2's approval passes its guard, holds the proposal row and waits for the case.
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := b.svc.ApproveResolution(actx, fin2, p.ID); done <- err }()
	waitLockWaiters(t, b.pool, 1)
	// The admin offboards fin1 meanwhile: her proposals are to be withdrawn.
	if _, err := acc.DisableUser(ctx, cli, fin1.Email); err != nil {
		t.Fatal(err)
	}
	cancel() // fin2 gives up (closed the tab); the approval rolls back
	if err := <-done; err == nil {
		t.Fatal("setup: the approval went through")
	}
	if err := resolve.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	return acc, cli, s, p
}
