package payments_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

var (
	supportStaff = payments.Staff{Email: "support@example.com", Role: "support"}
	finance1     = payments.Staff{Email: "f1@example.com", Role: "finance"}
	finance2     = payments.Staff{Email: "f2@example.com", Role: "finance"}
)

// eurLimit gives finance a direct refund limit of 5.00 EUR per payment.
func eurLimit(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 500} }

func staffRefund(id string, amount int64, intent string) payments.StaffRefundInput {
	return payments.StaffRefundInput{PaymentID: id, Amount: amount, Reason: "customer returned the goods", IntentKey: intent}
}

// Support's refund: the customer gets a code naming the amount; the same form again sends no
// second code; a wrong code refunds nothing; the right one refunds once (one gateway refund, one
// RefundIssued entry), and the same code again is a replay of that refund. A cancel's challenge
// never confirms a refund.
func TestSupportRefundConfirmedByCode(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-support-refund", 1000)
	form := staffRefund(s.ID, 400, uuid.NewString())
	ch, err := b.svc.RequestRefundCode(ctx, supportStaff, form)
	if err != nil || ch.Action != payments.CodeRefund || ch.Amount != 400 {
		t.Fatalf("request = %+v %v", ch, err)
	}
	var body string
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1 AND kind = 'refund_code'`, s.ID).Scan(&body); err != nil ||
		!strings.Contains(body, "refund of 4.00 EUR") {
		t.Fatalf("message %q %v: want one refund_code naming 4.00 EUR", body, err)
	}
	again, err := b.svc.RequestRefundCode(ctx, supportStaff, form)
	if err != nil || again.ID != ch.ID {
		t.Fatalf("the same form again = %+v %v, want challenge %s", again, err, ch.ID)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, s.ID); n != 1 {
		t.Fatalf("messages = %d, want 1 (the form's code is still open)", n)
	}
	code := b.lastCode(t, s.ID)
	if _, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, ch.ID, otherCode(code)); payments.ErrorCode(err) != payments.EWRONG {
		t.Fatalf("wrong code = %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM refunds`); n != 0 {
		t.Fatalf("a wrong code made %d refunds", n)
	}
	res, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, ch.ID, code)
	if err != nil || !res.Created || res.Refund.Status != payments.RefundSucceeded || res.Refund.Amount != 400 {
		t.Fatalf("confirm = %+v %v", res, err)
	}
	replay, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, ch.ID, code)
	if err != nil || replay.Created || replay.Refund.ID != res.Refund.ID {
		t.Fatalf("the same code again = %+v %v", replay, err)
	}
	if _, err := b.svc.RequestRefundCode(ctx, supportStaff, form); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("the used form again = %v, want conflict", err)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refunds = %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 1 {
		t.Fatalf("RefundIssued entries = %d", n)
	}
	// More than what is left is refused before any code is sent.
	if _, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 601, uuid.NewString())); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("over-refund = %v", err)
	}
	// A cancel's challenge is not a refund's.
	open := b.registered(t, "o-cancel-not-refund", 1000)
	cancel, err := b.svc.RequestCancel(ctx, api, open.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmRefund(ctx, supportStaff, open.ID, cancel.ID, b.lastCode(t, open.ID)); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("a cancel code for a refund = %v, want not found", err)
	}
}

// Refund codes spend the payment's one code budget (contract: "cancel, and any later
// code-confirmed action"): a new code replaces the earlier one, and the fourth request within an
// hour is ELOCKED with Retry-After.
func TestRefundCodesShareTheCodeLimits(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-refund-limits", 1000)
	first, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 100, uuid.NewString()))
	if err != nil {
		t.Fatal(err)
	}
	firstCode := b.lastCode(t, s.ID)
	b.clock.Advance(time.Minute)
	second, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 200, uuid.NewString()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, first.ID, firstCode); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("the superseded code = %v, want expired", err)
	}
	b.clock.Advance(time.Minute)
	if _, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 300, uuid.NewString())); err != nil {
		t.Fatal(err)
	}
	_, err = b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 400, uuid.NewString()))
	if payments.ErrorCode(err) != payments.ELOCKED || payments.RetryAfter(err) != 58*time.Minute {
		t.Fatalf("fourth code within the hour = %v (retry after %s), want locked for 58m", err, payments.RetryAfter(err))
	}
	if _, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, second.ID, firstCode); payments.ErrorCode(err) != payments.EEXPIRED {
		t.Fatalf("the second (superseded) challenge = %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM refunds`); n != 0 {
		t.Fatalf("refunds = %d", n)
	}
}

// Finance within REFUND_DIRECT_LIMIT refunds at once; the same form again is a replay (one
// gateway refund). Past the limit (the payment's refunds together) the form becomes a four-eyes
// proposal: no refund, no gateway call; the proposer cannot approve it; a second finance user's
// approval refunds through the refund core (one more gateway refund and ledger entry), and the
// form submitted again finds that refund.
func TestFinanceRefundDirectThenFourEyes(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	s := b.completed(t, "o-finance-refund", 2000)

	direct := staffRefund(s.ID, 300, uuid.NewString())
	r1, err := b.svc.RefundByFinance(ctx, finance1, direct)
	if err != nil || r1.Refund == nil || r1.Proposal != nil || r1.Refund.Status != payments.RefundSucceeded || r1.Replayed {
		t.Fatalf("direct refund = %+v %v", r1, err)
	}
	again, err := b.svc.RefundByFinance(ctx, finance1, direct)
	if err != nil || !again.Replayed || again.Refund == nil || again.Refund.ID != r1.Refund.ID {
		t.Fatalf("the same form again = %+v %v", again, err)
	}
	if _, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 100, direct.IntentKey)); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("the same form with another amount = %v, want conflict", err)
	}

	// 300 refunded + 300 more is past the 500 limit: a proposal.
	big := staffRefund(s.ID, 300, uuid.NewString())
	p, err := b.svc.RefundByFinance(ctx, finance1, big)
	if err != nil || p.Proposal == nil || p.Refund != nil || !p.Proposal.IsRefund() || p.Proposal.RefundAmount != 300 || !p.Proposal.Pending() {
		t.Fatalf("above the limit = %+v %v", p, err)
	}
	if again, err := b.svc.RefundByFinance(ctx, finance1, big); err != nil || !again.Replayed || again.Proposal == nil || again.Proposal.ID != p.Proposal.ID {
		t.Fatalf("the proposing form again = %+v %v", again, err)
	}
	if _, err := b.svc.RefundByFinance(ctx, finance2, staffRefund(s.ID, 100, uuid.NewString())); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("another proposal while one waits = %v, want conflict", err)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refunds before approval = %d, want 1", n)
	}
	if _, err := b.svc.ApproveResolution(ctx, finance1, p.Proposal.ID); payments.ErrorCode(err) != payments.EFORBIDDEN {
		t.Fatalf("the proposer's approval = %v, want forbidden", err)
	}
	approved, err := b.svc.ApproveResolution(ctx, finance2, p.Proposal.ID)
	if err != nil || approved.State != payments.ResolutionApproved || approved.RefundID == "" {
		t.Fatalf("approval = %+v %v", approved, err)
	}
	refund, err := b.svc.GetRefund(ctx, approved.RefundID)
	if err != nil || refund.Status != payments.RefundSucceeded || refund.Amount != 300 {
		t.Fatalf("approved refund = %+v %v", refund, err)
	}
	if again, err := b.svc.RefundByFinance(ctx, finance1, big); err != nil || !again.Replayed || again.Refund == nil || again.Refund.ID != refund.ID {
		t.Fatalf("the proposing form after approval = %+v %v", again, err)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 2 {
		t.Fatalf("gateway refunds = %d, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != 2 {
		t.Fatalf("RefundIssued entries = %d, want 2", n)
	}
	actions := b.count(t, `SELECT count(*) FROM audit_log WHERE target = $1 AND action IN ('resolution.propose', 'resolution.approve')`, s.ID)
	if actions != 2 {
		t.Fatalf("audit entries of the four-eyes refund = %d, want propose and approve", actions)
	}
	// Past what was received: refused, whatever the limit.
	if _, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 1401, uuid.NewString())); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("over-refund = %v", err)
	}
}

// Two finance refunds of 3.00 EUR at once on one payment, under a 5.00 EUR limit. The first
// is parked holding the order → session locks; the second is seen waiting for them; then both
// go on. The second counts the first's refund: one refund, one proposal.
func TestDirectRefundLimitHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	p := newParker()
	hooked := func(c *payments.Config) {
		eurLimit(c)
		c.Hooks.AfterRefundLock = p.hook
	}
	b := newBench(t, hooked)
	other := b.service(testdb.Pool(t, b.url), "replica-b", hooked)
	s := b.completed(t, "o-limit-race", 1000)
	type out struct {
		r   payments.FinanceRefund
		err error
	}
	run := func(svc *payments.Service, by payments.Staff) <-chan out {
		ch := make(chan out, 1)
		go func() {
			r, err := svc.RefundByFinance(context.Background(), by, staffRefund(s.ID, 300, uuid.NewString()))
			ch <- out{r, err}
		}()
		return ch
	}
	first := run(b.svc, finance1)
	mustWait(t, p.arrived, "the first refund holds the locks")
	second := run(other, finance2)
	waitLockWaiters(t, b.pool, 1)
	p.let(1)
	mustWait(t, p.arrived, "the second refund gets the locks")
	p.let(1)
	o1, o2 := mustWait(t, first, "refund 1"), mustWait(t, second, "refund 2")
	if o1.err != nil || o2.err != nil || o1.r.Refund == nil || o2.r.Proposal == nil {
		t.Fatalf("outcomes = %+v %v / %+v %v, want a refund, then a proposal", o1.r, o1.err, o2.r, o2.err)
	}
	if n := b.count(t, `SELECT coalesce(sum(amount), 0)::int FROM refunds`); n != 300 {
		t.Fatalf("refunded without a second person = %d, want 300", n)
	}
}

// naiveDirectRefund judges the limit outside the serialising locks: read what was refunded,
// then refund through the core. The negative control of the test above.
func naiveDirectRefund(ctx context.Context, svc *payments.Service, pool *pgxpool.Pool, id string, limit, amount int64, afterRead func(context.Context, string)) (bool, error) {
	var committed int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(amount), 0) FROM refunds WHERE session_id = $1 AND status <> 'Failed'`, id).Scan(&committed); err != nil {
		return false, err
	}
	afterRead(ctx, id)
	if committed+amount > limit {
		return false, nil // would be a proposal
	}
	_, err := svc.CreateRefund(ctx, payments.Actor{Kind: payments.ActorStaff, ID: "naive"}, payments.RefundInput{PaymentID: id, Amount: amount, RequestKey: uuid.NewString()})
	return err == nil, err
}

// The negative control: the same two refunds, both judged before either is claimed, both pass
// the limit: 6.00 EUR refunded without a second person.
func TestDirectRefundLimitNaiveCheckOverspends(t *testing.T) {
	t.Parallel()
	p := newParker()
	b := newBench(t, eurLimit)
	s := b.completed(t, "o-limit-naive", 1000)
	res := make(chan bool, 2)
	for range 2 {
		go func() {
			ok, err := naiveDirectRefund(context.Background(), b.svc, b.pool, s.ID, 500, 300, p.hook)
			if err != nil {
				t.Error(err)
			}
			res <- ok
		}()
	}
	mustWait(t, p.arrived, "first read")
	mustWait(t, p.arrived, "second read")
	p.let(2)
	if !mustWait(t, res, "naive 1") || !mustWait(t, res, "naive 2") {
		t.Fatal("the naive check refused one: the control expected both to pass")
	}
	if n := b.count(t, `SELECT coalesce(sum(amount), 0)::int FROM refunds`); n != 600 {
		t.Fatalf("naive refunded %d; the control expected 600 (past the 500 limit)", n)
	}
}

// One refund form submitted twice at once (a double click): the first holds the locks, the
// second waits, then finds the refund the form's intent key made. One refund, one gateway call.
// The negative control below submits the same two clicks with a fresh key each (a form without
// an intent key) and gets two refunds: what the key prevents.
func TestRefundFormDoubleSubmitRefundsOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		sameKey   bool
		wantCalls int
	}{{"one intent key", true, 1}, {"negative control: a key per submit", false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newParker()
			b := newBench(t, func(c *payments.Config) {
				c.RefundDirectLimit = map[string]int64{"EUR": 1000}
				c.Hooks.AfterRefundLock = p.hook
			})
			s := b.completed(t, "o-double-submit", 1000)
			key := uuid.NewString()
			submit := func() <-chan error {
				ch := make(chan error, 1)
				k := key
				if !tc.sameKey {
					k = uuid.NewString()
				}
				go func() {
					_, err := b.svc.RefundByFinance(context.Background(), finance1, staffRefund(s.ID, 200, k))
					ch <- err
				}()
				return ch
			}
			e1 := submit()
			mustWait(t, p.arrived, "the first submit holds the locks")
			e2 := submit()
			waitLockWaiters(t, b.pool, 1)
			p.let(1)
			mustWait(t, p.arrived, "the second submit gets the locks")
			p.let(1)
			if err1, err2 := mustWait(t, e1, "submit 1"), mustWait(t, e2, "submit 2"); err1 != nil || err2 != nil {
				t.Fatalf("submits = %v / %v", err1, err2)
			}
			if n := b.gw.Calls(fakegw.OpRefund); n != tc.wantCalls {
				t.Fatalf("gateway refunds = %d, want %d", n, tc.wantCalls)
			}
			if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE entry_type = 'RefundIssued'`); n != tc.wantCalls {
				t.Fatalf("RefundIssued entries = %d, want %d", n, tc.wantCalls)
			}
		})
	}
}

// A refund code is a one-time code like a cancel's: when its delivery failed and a newer code
// replaced it, the outbox retry sends only the newer one (the older is skipped, redacted).
// Before the retry knew every code message (not only cancel_code), it sent both.
func TestOutboxRetrySkipsDeadRefundCodes(t *testing.T) {
	t.Parallel()
	n := &flakyNotifier{down: true}
	b := newBench(t, func(c *payments.Config) { c.Notifier = n })
	ctx := context.Background()
	s := b.completed(t, "o-dead-refund-code", 1000)
	if _, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 100, uuid.NewString())); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Minute)
	if _, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 200, uuid.NewString())); err != nil {
		t.Fatal(err)
	}
	newCode := b.lastCode(t, s.ID)
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
	b.clock.Advance(2 * time.Minute)
	if sent, err := b.svc.DeliverOutbox(ctx); sent != 1 || err != nil {
		t.Fatalf("retry sent %d (%v), want 1: only the live code", sent, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.got) != 1 || !strings.Contains(n.got[0].Text, newCode) || !strings.Contains(n.got[0].Text, "refund of 2.00 EUR") {
		t.Fatalf("delivered %+v, want only the newer code %s", n.got, newCode)
	}
	if c := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1 AND skip_reason = 'superseded' AND body NOT LIKE '%' || $2 || '%'`, s.ID, newCode); c != 1 {
		t.Fatalf("superseded refund code messages skipped and redacted = %d, want 1", c)
	}
}

// A refund proposal waiting for approval holds its amount against the console's refunds: with
// 8.00 of 10.00 EUR proposed, a support code for 3.00 is refused before any message goes out
// (naming the proposal), one for 2.00 is sent; a code sent before the proposal cannot be spent
// on money the proposal needs (refused, its code left unspent); finance's own direct refund is
// refused the same way. The approval then refunds the 8.00. The API's refunds are the shop's and
// are not held back: with a proposal waiting, the API refunds, and the approval that no longer
// fits is refused by the refund core.
func TestWaitingRefundProposalHoldsItsAmount(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	s := b.completed(t, "o-proposal-holds", 1000)
	early, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 300, uuid.NewString()))
	if err != nil {
		t.Fatal(err)
	}
	earlyCode := b.lastCode(t, s.ID)
	p, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 800, uuid.NewString()))
	if err != nil || p.Proposal == nil {
		t.Fatalf("proposal = %+v %v", p, err)
	}
	messages := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, s.ID)
	_, err = b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 300, uuid.NewString()))
	if payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(err.Error(), "waits for approval") {
		t.Fatalf("a support code for more than the proposal leaves = %v, want a conflict naming the proposal", err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, s.ID); n != messages {
		t.Fatalf("messages = %d, want %d (nothing sent for a refused refund)", n, messages)
	}
	if _, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, early.ID, earlyCode); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("the early code spent on the proposal's money = %v, want conflict", err)
	}
	if n := b.count(t, `SELECT count(*) FROM cancel_challenges WHERE id = $1 AND consumed_at IS NULL`, early.ID); n != 1 {
		t.Fatal("the refused confirmation spent the code")
	}
	if _, err := b.svc.RefundByFinance(ctx, finance2, staffRefund(s.ID, 300, uuid.NewString())); payments.ErrorCode(err) != payments.ECONFLICT ||
		!strings.Contains(err.Error(), "waits for approval") {
		t.Fatalf("finance's refund for more than the proposal leaves = %v, want a conflict naming the proposal", err)
	}
	if n := b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1`, s.ID); n != 0 {
		t.Fatalf("refunds while the proposal waits = %d, want 0", n)
	}
	// What the proposal leaves can still be refunded.
	small, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 200, uuid.NewString()))
	if err != nil {
		t.Fatalf("a support code within what the proposal leaves = %v", err)
	}
	if res, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, small.ID, b.lastCode(t, s.ID)); err != nil || res.Refund.Amount != 200 {
		t.Fatalf("confirm within what is left = %+v %v", res, err)
	}
	approved, err := b.svc.ApproveResolution(ctx, finance2, p.Proposal.ID)
	if err != nil || approved.State != payments.ResolutionApproved {
		t.Fatalf("approval = %+v %v", approved, err)
	}
	if n := b.count(t, `SELECT coalesce(sum(amount), 0) FROM accounting_entries WHERE session_id = $1 AND entry_type = 'RefundIssued'`, s.ID); n != 1000 {
		t.Fatalf("refunded %d, want 1000", n)
	}

	// The API is not held back.
	s2 := b.completed(t, "o-proposal-api", 1000)
	p2, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s2.ID, 800, uuid.NewString()))
	if err != nil || p2.Proposal == nil {
		t.Fatalf("proposal = %+v %v", p2, err)
	}
	if r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s2.ID, Amount: 300, RequestKey: "shop-refund"}); err != nil || !r.Created {
		t.Fatalf("the API's refund beside a waiting proposal = %+v %v", r, err)
	}
	if _, err := b.svc.ApproveResolution(ctx, finance2, p2.Proposal.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("approving a proposal that no longer fits = %v, want conflict", err)
	}
}

// A person's refund reason is what the audit log keeps of the refund, and the audit row is
// written after the refund: text PostgreSQL cannot store (a NUL, bytes that are not UTF-8) is
// refused before anything moves. Before, the refund went out and its audit row was refused
// afterwards (an outside audit: refunds with no audit row).
func TestStaffRefundReasonMustBeStorable(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	s := b.completed(t, "o-reason", 2000)
	for _, reason := range []string{"nul\x00byte", "bad\xffutf8", "escape\x1b[31m"} {
		in := staffRefund(s.ID, 100, uuid.NewString())
		in.Reason = reason
		if _, err := b.svc.RefundByFinance(ctx, finance1, in); payments.ErrorCode(err) != payments.EINVALID {
			t.Fatalf("finance refund with reason %q = %v, want invalid", reason, err)
		}
		if _, err := b.svc.RequestRefundCode(ctx, supportStaff, in); payments.ErrorCode(err) != payments.EINVALID {
			t.Fatalf("support code request with reason %q = %v, want invalid", reason, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM refunds`) + b.count(t, `SELECT count(*) FROM cancel_challenges`); n != 0 {
		t.Fatalf("refunds and challenges = %d, want 0", n)
	}
	// Line breaks and tabs are text.
	in := staffRefund(s.ID, 100, uuid.NewString())
	in.Reason = "customer called:\n\tdouble charge"
	if _, err := b.svc.RefundByFinance(ctx, finance1, in); err != nil {
		t.Fatal(err)
	}
}

// An admin may start support's refund and read the outbox, where an undelivered message still
// holds its code. A code confirmed by someone who read it proves nothing about the customer:
// before, one admin requested a refund code above any direct limit, read it in the outbox and
// confirmed it alone (an outside audit), and could cancel a payment the same way. Whoever the
// outbox showed a code to is refused when confirming it (not a wrong guess, nothing consumed);
// someone who did not see it confirms it with the customer as before.
func TestCodeSeenInTheOutboxIsNotConfirmedByItsReader(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	admin := payments.Staff{Email: "admin@example.com", Role: "admin"}
	s := b.completed(t, "o-admin-code", 10000)

	ch, err := b.svc.RequestRefundCode(ctx, admin, staffRefund(s.ID, 8000, uuid.NewString()))
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, s.ID)
	msgs, err := b.svc.Outbox(ctx, admin, s.ID)
	if err != nil || len(msgs) == 0 || !strings.Contains(msgs[0].Body, code) {
		t.Fatalf("outbox = %+v %v: want the undelivered message with its code", msgs, err)
	}
	if _, err := b.svc.ConfirmRefund(ctx, admin, s.ID, ch.ID, code); payments.ErrorCode(err) != payments.EFORBIDDEN {
		t.Fatalf("the admin who read the code confirms it = %v, want forbidden", err)
	}
	if n := b.count(t, `SELECT count(*) FROM refunds`) + b.count(t, `SELECT count(*) FROM code_wrong_guesses`); n != 0 {
		t.Fatalf("refunds and wrong guesses = %d, want 0", n)
	}
	res, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, ch.ID, code)
	if err != nil || res.Refund.Amount != 8000 {
		t.Fatalf("support, who did not see it, confirms it = %+v %v", res, err)
	}

	// A cancel code, read by the admin: the admin's confirmation is refused; the customer's (the
	// API relaying it) goes through.
	p := b.registered(t, "o-admin-cancel", 1000)
	cc, err := b.svc.RequestCancel(ctx, admin.Actor(), p.ID)
	if err != nil {
		t.Fatal(err)
	}
	code = b.lastCode(t, p.ID)
	if _, err := b.svc.Outbox(ctx, admin, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.svc.ConfirmCancel(ctx, admin.Actor(), p.ID, cc.ID, code); payments.ErrorCode(err) != payments.EFORBIDDEN {
		t.Fatalf("the admin who read the cancel code confirms it = %v, want forbidden", err)
	}
	if r, err := b.svc.ConfirmCancel(ctx, api, p.ID, cc.ID, code); err != nil || r.Session.Status != payments.StatusCanceled {
		t.Fatalf("the customer's confirmation = %+v %v", r, err)
	}
}

// passwordSetBy records that setter set account's password in the console (what
// access.SetPassword and CreateUser write, migration 00490).
func (b *bench) passwordSetBy(t *testing.T, account payments.Staff, setter string) {
	t.Helper()
	b.exec(t, `INSERT INTO staff_users (email, role, password_hash, created_at, password_set_by) VALUES ($1, $2, 'x', $3, $4)
		ON CONFLICT (email) DO UPDATE SET password_set_by = excluded.password_set_by`, account.Email, account.Role, b.clock.Now(), setter)
}

// An admin who read a code in the outbox, set a support user's password and signed in as them
// confirmed the code alone (audit 8): "whoever reads a code does not confirm it" bound accounts,
// not people. Whoever set an account's password now counts as that account: its confirmation of
// a code the setter read is refused (nothing consumed, no wrong guess), and the other way round
// (the setter confirming a code the account read); a support user whose password the admin did
// not set confirms it as before.
func TestCodeSeenByWhoeverSetTheConfirmersPassword(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	admin := payments.Staff{Email: "admin@example.com", Role: "admin"}
	other := payments.Staff{Email: "support2@example.com", Role: "support"}
	s := b.completed(t, "o-taken-over", 10000)
	b.passwordSetBy(t, supportStaff, admin.Email)

	ch, err := b.svc.RequestRefundCode(ctx, admin, staffRefund(s.ID, 8000, uuid.NewString()))
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, s.ID)
	if _, err := b.svc.Outbox(ctx, admin, s.ID); err != nil {
		t.Fatal(err)
	}
	_, err = b.svc.ConfirmRefund(ctx, supportStaff, s.ID, ch.ID, code)
	wantCode(t, err, payments.EFORBIDDEN, "admin@example.com saw this code in the outbox, and one of you set the other's password")
	if n := b.count(t, `SELECT count(*) FROM refunds`) + b.count(t, `SELECT count(*) FROM code_wrong_guesses`); n != 0 {
		t.Fatalf("refunds and wrong guesses = %d, want 0", n)
	}
	if res, err := b.svc.ConfirmRefund(ctx, other, s.ID, ch.ID, code); err != nil || res.Refund.Amount != 8000 {
		t.Fatalf("a support user whose password the admin did not set = %+v %v", res, err)
	}

	// The other way round: the admin set the reader's password (a second admin account).
	reader := payments.Staff{Email: "admin2@example.com", Role: "admin"}
	b.passwordSetBy(t, reader, admin.Email)
	p := b.registered(t, "o-taken-over-2", 1000)
	cc, err := b.svc.RequestCancel(ctx, reader.Actor(), p.ID)
	if err != nil {
		t.Fatal(err)
	}
	code = b.lastCode(t, p.ID)
	if _, err := b.svc.Outbox(ctx, reader, ""); err != nil {
		t.Fatal(err)
	}
	_, err = b.svc.ConfirmCancel(ctx, admin.Actor(), p.ID, cc.ID, code)
	wantCode(t, err, payments.EFORBIDDEN, "admin2@example.com saw this code in the outbox")
}

// The same code sent again after its refund was flagged (the patrol gave up on it) answers the
// refund as it is and asks the gateway nothing: a replay is not a second drive. Support's old
// form would otherwise drive a flagged refund unleased — around "Retry now" (finance's), beside
// a proposal to settle it by hand, and once the gateway may have forgotten the key, beside the
// patrol's own drive, both finding nothing and both sending.
// Negative control (run by hand): with settleRefund driving what a replay found, the gateway is
// asked again.
func TestRefundCodeReplayDoesNotDriveTheRefund(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule)
	ctx := context.Background()
	s := b.completed(t, "o-replay-flagged", 1000)
	ch, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 400, uuid.NewString()))
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, s.ID)
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 4) // the request and the schedule's three looks
	res, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, ch.ID, code)
	if err != nil || !res.Created || res.Refund.Status != payments.RefundPending {
		t.Fatalf("confirm = %+v %v", res, err)
	}
	b.clock.Advance(payments.StaleAfterFor(0))
	for range 5 {
		if _, err := b.svc.DriveRefunds(ctx); err != nil {
			t.Fatal(err)
		}
		b.clock.Advance(time.Second)
	}
	if got, _ := b.svc.GetRefund(ctx, res.Refund.ID); got.FlaggedAt == nil || got.Status != payments.RefundPending {
		t.Fatalf("setup: %+v", got)
	}
	asked := b.gw.KeyCalls(fakegw.OpRefund, res.Refund.ID)
	replay, err := b.svc.ConfirmRefund(ctx, supportStaff, s.ID, ch.ID, code)
	if err != nil || replay.Created || replay.Refund.ID != res.Refund.ID || replay.Refund.Status != payments.RefundPending || replay.Refund.FlaggedAt == nil {
		t.Fatalf("the same code again = %+v %v, want the flagged refund as it is", replay, err)
	}
	if n := b.gw.KeyCalls(fakegw.OpRefund, res.Refund.ID); n != asked {
		t.Fatalf("the replay asked the gateway: %d refund calls, %d before", n, asked)
	}
}

// staleForm is a console refund form whose page showed seen of the payment's refunds.
func staleForm(id string, amount int64, seen payments.RefundsSeen) payments.StaffRefundInput {
	in := staffRefund(id, amount, uuid.NewString())
	in.Seen = &seen
	return in
}

// seenNow is what the payment's page shows of its refunds now (its forms' seen).
func (b *bench) seenNow(t *testing.T, id string) payments.RefundsSeen {
	t.Helper()
	d, err := b.svc.PaymentDetail(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return d.RefundsSeen()
}

// TestARefundFormFromAStalePageRefundsNothing: a console refund form was judged by its amount
// alone, so a form whose page was read before another refund of the payment (a second finance
// user, another tab, the shop's API) refunded again what its person meant to refund once — the
// customer got the money twice. Every console way in (finance's direct refund, finance's
// proposal above the limit, support's code) now refuses a form whose seen is not what counts
// against the payment now (its refunds but Failed ones, and a waiting refund proposal, as the
// page's "refundable now" is computed), after the form's replay look-ups: the same form sent
// again still finds its first outcome. A form without seen (a page of the previous release) is
// judged by its amount as before.
func TestARefundFormFromAStalePageRefundsNothing(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	s := b.completed(t, "o-stale-refund-form", 1000)
	// The forms below were rendered while nothing was refunded (seen 0); the shop's API then
	// refunds 2.00.
	if _, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 200, RequestKey: "shop-1"}); err != nil {
		t.Fatal(err)
	}
	stale := func(what string, err error) {
		t.Helper()
		wantCode(t, err, payments.ECONFLICT, "the payment's refunds changed since you read the page (now 2.00 EUR refunded or waiting for approval, 8.00 EUR refundable)")
		if f := (*payments.Error)(nil); !errors.As(err, &f) || f.Field != "seen" {
			t.Fatalf("%s: refusal %v names no field seen (the console shows the form again on it)", what, err)
		}
	}
	_, err := b.svc.RefundByFinance(ctx, finance1, staleForm(s.ID, 200, payments.RefundsSeen{}))
	stale("a direct refund", err)
	_, err = b.svc.RefundByFinance(ctx, finance1, staleForm(s.ID, 600, payments.RefundsSeen{})) // above the limit: a proposal
	stale("a proposal", err)
	_, err = b.svc.RequestRefundCode(ctx, supportStaff, staleForm(s.ID, 200, payments.RefundsSeen{}))
	stale("a support code", err)
	if n := b.gw.Calls(fakegw.OpRefund); n != 1 {
		t.Fatalf("gateway refunds = %d, want 1 (the API's)", n)
	}
	if r, p, m := b.count(t, `SELECT count(*) FROM refunds`), b.count(t, `SELECT count(*) FROM resolution_proposals`),
		b.count(t, `SELECT count(*) FROM outbox WHERE payment_id = $1`, s.ID); r != 1 || p != 0 || m != 0 {
		t.Fatalf("stale forms made %d refunds (want the API's 1), %d proposals, %d messages", r, p, m)
	}

	// A form of the page as it is refunds; sent again after the payment moved on, it replays.
	form := staleForm(s.ID, 200, b.seenNow(t, s.ID))
	out, err := b.svc.RefundByFinance(ctx, finance1, form)
	if err != nil || out.Refund == nil || out.Replayed {
		t.Fatalf("a form of the current page = %+v %v", out, err)
	}
	if _, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 100, RequestKey: "shop-2"}); err != nil {
		t.Fatal(err)
	}
	again, err := b.svc.RefundByFinance(ctx, finance1, form)
	if err != nil || !again.Replayed || again.Refund == nil || again.Refund.ID != out.Refund.ID {
		t.Fatalf("the same form sent again = %+v %v, want its refund replayed", again, err)
	}

	// A waiting proposal counts as the page counts it: 5.00 refunded and 3.00 proposed is 8.00.
	before := b.seenNow(t, s.ID)
	if p, err := b.svc.RefundByFinance(ctx, finance1, staleForm(s.ID, 300, before)); err != nil || p.Proposal == nil {
		t.Fatalf("proposal = %+v %v", p, err)
	}
	d, err := b.svc.PaymentDetail(ctx, s.ID)
	if err != nil || d.RefundsCounted() != 800 || d.Refundable() != 200 {
		t.Fatalf("the page counts %d, refundable %d (%v); want 800 and 200", d.RefundsCounted(), d.Refundable(), err)
	}
	_, err = b.svc.RequestRefundCode(ctx, supportStaff, staleForm(s.ID, 100, before))
	wantCode(t, err, payments.ECONFLICT, "now 8.00 EUR refunded or waiting for approval, 2.00 EUR refundable")
	if _, err := b.svc.RequestRefundCode(ctx, supportStaff, staleForm(s.ID, 100, b.seenNow(t, s.ID))); err != nil {
		t.Fatalf("a support form of the current page: %v", err)
	}
	// A form without seen (a page of the previous release): its amount alone, as before.
	if _, err := b.svc.RequestRefundCode(ctx, supportStaff, staffRefund(s.ID, 100, uuid.NewString())); err != nil {
		t.Fatalf("a form without seen: %v", err)
	}
	if n := b.gw.Calls(fakegw.OpRefund); n != 3 {
		t.Fatalf("gateway refunds = %d, want 3", n)
	}
}

// The page's seen was a sum (what counted against the refundable amount): a refund that failed
// after the page was read beside a new one of the same amount left it as it was, and a form of
// the older page passed — F2 refunded ticket T from another tab, the shop's stuck refund A was
// refused, and F1's form for the same ticket refunded it again. seen now also names how many
// refunds the page had and which proposal waited. An outside review (a staff chaos day);
// negative control: RefundsSeen compared by Counted alone, F1's form passes.
func TestARefundFormIsNotFooledByARefundFailingBesideANewOne(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.RefundDirectLimit = map[string]int64{"EUR": 1_000_000} })
	ctx := context.Background()
	paid := b.completed(t, "o-seen-aba", 1000)
	// The shop's refund A of 3.00: its answer is lost (a 503), Pending for the patrol.
	b.gw.Fail(fakegw.OpRefund, fakegw.Transient, 1)
	a, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: paid.ID, Amount: 300, RequestKey: "shop-a"})
	if err != nil || a.Refund.Status != payments.RefundPending {
		t.Fatalf("setup: %+v %v", a.Refund, err)
	}
	// F1 and F2 read the payment's page; both are about ticket T (3.00 more).
	seen := b.seenNow(t, paid.ID)
	if f2, err := b.svc.RefundByFinance(ctx, finance1, staleForm(paid.ID, 300, seen)); err != nil || f2.Refund == nil || f2.Refund.Status != payments.RefundSucceeded {
		t.Fatalf("F2's refund of ticket T: %+v %v", f2, err)
	}
	// The gateway refuses the shop's refund A when the patrol sends it again: A is Failed, and
	// what counts against the payment is 3.00 again.
	b.clock.Advance(time.Hour)
	b.gw.Fail(fakegw.OpRefund, fakegw.Definitive, 1)
	if _, err := b.svc.DriveRefunds(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := b.svc.GetRefund(ctx, a.Refund.ID); r.Status != payments.RefundFailed || b.seenNow(t, paid.ID).Counted != seen.Counted {
		t.Fatalf("setup: refund A is %s", r.Status)
	}
	_, err = b.svc.RefundByFinance(ctx, finance1, staleForm(paid.ID, 300, seen))
	wantCode(t, err, payments.ECONFLICT, "the payment's refunds changed since you read the page")
	if n := b.gw.Refunds(paid.GatewayPaymentID); n != 1 {
		t.Fatalf("%d refunds at the gateway, want F2's one", n)
	}
}

// TestAShopRefundSinceTheProposalStopsItsApproval: the shop's API refunds are not held back by a
// waiting refund proposal, so one that fits beside it may be the very refund the proposal asks
// for: a proposal of 6.00 and the shop's 4.00 for the same complaint, both fitting in 10.00,
// approved 6.00 more (an outside review, numbers2). The approval is refused, naming the
// shop's refund, and nothing is sent; a shop refund that failed moved nothing and does not stop
// it, nor does a person's refund of the room the proposal left (TestWaitingRefundProposalHoldsItsAmount).
func TestAShopRefundSinceTheProposalStopsItsApproval(t *testing.T) {
	t.Parallel()
	b := newBench(t, eurLimit)
	ctx := context.Background()
	s := b.completed(t, "o-proposal-outrun", 1000)
	p, err := b.svc.RefundByFinance(ctx, finance1, staffRefund(s.ID, 600, uuid.NewString()))
	if err != nil || p.Proposal == nil {
		t.Fatalf("proposal = %+v %v", p, err)
	}
	b.clock.Advance(time.Minute)
	if r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 400, RequestKey: "shop-refund"}); err != nil || !r.Created {
		t.Fatalf("the shop's refund = %+v %v", r, err)
	}
	calls := b.gw.Calls(fakegw.OpRefund)
	_, err = b.svc.ApproveResolution(ctx, finance2, p.Proposal.ID)
	if payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(err.Error(), "through the API since the proposal") {
		t.Fatalf("approving a proposal the shop's refund came after = %v, want a conflict naming it", err)
	}
	if got := b.gw.Calls(fakegw.OpRefund); got != calls {
		t.Fatalf("%d refund calls to the gateway by the refused approval", got-calls)
	}
	if n := b.count(t, `SELECT count(*) FROM refunds WHERE session_id = $1`, s.ID); n != 1 {
		t.Fatalf("refunds = %d, want the shop's one", n)
	}
	if n := b.count(t, `SELECT count(*) FROM resolution_proposals WHERE id = $1 AND state = 'proposed'`, p.Proposal.ID); n != 1 {
		t.Fatal("the refused approval decided the proposal")
	}
}
