package payments_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

var financeStaff = payments.Staff{Email: "fin@example.com", Role: "finance"}

// createIn creates a session (Registered unless the gateway is told otherwise) for currency.
func (b *bench) createIn(t *testing.T, orderID string, amount int64, currency string) payments.Session {
	t.Helper()
	r, err := b.plain.Create(context.Background(), api, payments.CreateInput{OrderID: orderID, Amount: amount, Currency: currency})
	if err != nil {
		t.Fatal(err)
	}
	return r.Session
}

func (b *bench) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// stuckPages reads the workbench under f page by page (at most 10), following Next.
func stuckPages(t *testing.T, b *bench, f payments.StuckFilter) []string {
	t.Helper()
	var got []string
	for range 10 {
		p, err := b.svc.StuckSessions(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ids(p.Sessions)...)
		if p.Next == "" {
			break
		}
		f.After = p.Next
	}
	return got
}

func ids(list []payments.StuckSession) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = s.ID
	}
	return out
}

// The workbench lists active sessions older than SettleWithin (nothing younger, nothing
// settled), with their attempts, lease, flag, last gateway answer, mismatch and proposal; it
// filters by state, currency, flag and age, sorts by age or amount, pages by keyset, and sums
// the money per state and currency over the whole filter.
func TestStuckSessionsListFiltersAndTotals(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()

	old1 := b.createIn(t, "o-old-1", 1000, "EUR") // Registered, oldest
	b.clock.Advance(time.Minute)
	b.gw.Fail(fakegw.OpRegister, fakegw.Transient, 1)
	old2 := b.createIn(t, "o-old-2", 5000, "EUR") // Unknown
	b.clock.Advance(time.Minute)
	old3 := b.createIn(t, "o-old-3", 300, "USD") // Registered, flagged below
	b.clock.Advance(time.Minute)
	done := b.createIn(t, "o-done", 700, "EUR") // Completed below: never stuck
	b.gw.SetStatus(done.GatewayPaymentID, payments.GatewaySucceeded)
	if _, err := b.plain.Check(ctx, api, done.ID); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(payments.SettleWithin + time.Second)
	young := b.createIn(t, "o-young", 9000, "EUR") // too young to be stuck
	b.exec(t, `UPDATE payment_sessions SET flagged_at = $2, flag_reason = 'schedule ran out', check_attempts = 17 WHERE id = $1`, old3.ID, b.clock.Now())
	b.exec(t, `UPDATE payment_sessions SET lease_owner = 'replica-z', lease_until = $2 WHERE id = $1`, old1.ID, b.clock.Now().Add(time.Minute))
	b.exec(t, `INSERT INTO finance_cases (session_id, order_id, kind, detail, created_at) VALUES ($1, 'o-old-1', 'gateway_mismatch', 'x', $2)`, old1.ID, b.clock.Now())
	// The last gateway answer: a Check of old1 (the gateway says pending) after its registration.
	if _, err := b.plain.Check(ctx, api, old1.ID); err != nil {
		t.Fatal(err)
	}

	page, err := b.svc.StuckSessions(ctx, payments.StuckFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(page.Sessions), []string{old1.ID, old2.ID, old3.ID}; !slices.Equal(got, want) {
		t.Fatalf("stuck (oldest first) = %v, want %v (young %s, done %s)", got, want, young.ID, done.ID)
	}
	row := page.Sessions[0]
	if !row.Leased(page.At) || row.LeaseOwner != "replica-z" || !row.Mismatch || row.LastCall == nil ||
		row.LastCall.Operation != "status" || row.LastCall.Detail != "gateway says pending" {
		t.Fatalf("old1 row: leased=%v owner=%q mismatch=%v last=%+v", row.Leased(page.At), row.LeaseOwner, row.Mismatch, row.LastCall)
	}
	if r := page.Sessions[1]; r.Status != payments.StatusUnknown || r.LastCall == nil || r.LastCall.Outcome != "unknown" {
		t.Fatalf("old2 row: %s last=%+v", r.Status, r.LastCall)
	}
	if r := page.Sessions[2]; r.FlaggedAt == nil || r.CheckAttempts != 17 {
		t.Fatalf("old3 row: flagged %v attempts %d", r.FlaggedAt, r.CheckAttempts)
	}
	wantTotals := []payments.StuckTotal{
		{Status: payments.StatusRegistered, Currency: "EUR", Count: 1, Amount: 1000},
		{Status: payments.StatusUnknown, Currency: "EUR", Count: 1, Amount: 5000},
		{Status: payments.StatusRegistered, Currency: "USD", Count: 1, Amount: 300},
	}
	if !slices.Equal(page.Totals, wantTotals) {
		t.Fatalf("totals = %+v, want %+v", page.Totals, wantTotals)
	}

	for name, c := range map[string]struct {
		f    payments.StuckFilter
		want []string
	}{
		"by amount":    {payments.StuckFilter{Sort: payments.StuckByAmount}, []string{old2.ID, old1.ID, old3.ID}},
		"state":        {payments.StuckFilter{Status: payments.StatusUnknown}, []string{old2.ID}},
		"currency":     {payments.StuckFilter{Currency: "usd"}, []string{old3.ID}},
		"flagged":      {payments.StuckFilter{Flagged: payments.FlagFlagged}, []string{old3.ID}},
		"not flagged":  {payments.StuckFilter{Flagged: payments.FlagNot}, []string{old1.ID, old2.ID}},
		"older than":   {payments.StuckFilter{MinAge: payments.SettleWithin + 150*time.Second}, []string{old1.ID}},
		"settle floor": {payments.StuckFilter{MinAge: time.Second}, []string{old1.ID, old2.ID, old3.ID}},
	} {
		p, err := b.svc.StuckSessions(ctx, c.f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := ids(p.Sessions); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}

	// Keyset pages of one row, both orders, end where the list ends.
	for _, sort := range []payments.StuckSort{payments.StuckByAge, payments.StuckByAmount} {
		got := stuckPages(t, b, payments.StuckFilter{Sort: sort, Limit: 1})
		want := []string{old1.ID, old2.ID, old3.ID}
		if sort == payments.StuckByAmount {
			want = []string{old2.ID, old1.ID, old3.ID}
		}
		if !slices.Equal(got, want) {
			t.Errorf("pages by %s = %v, want %v", sort, got, want)
		}
	}

	for _, bad := range []payments.StuckFilter{{Status: payments.StatusCompleted}, {Currency: "EURO"}, {Sort: "name"},
		{Flagged: "maybe"}, {After: "x_y"},
		// Cursors no page row ever had (the finance review: a time before 4714 BC was a 500 from
		// PostgreSQL; -2^63 as an amount overflowed when negated and served the first page again).
		{After: "-300000000000000000_" + old1.ID}, {After: "-9000000000000000000_" + old1.ID},
		{Sort: payments.StuckByAmount, After: "EUR_-9223372036854775808_" + old1.ID},
		{Sort: payments.StuckByAmount, After: "EUR_0_" + old1.ID}} {
		if _, err := b.svc.StuckSessions(ctx, bad); payments.ErrorCode(err) != payments.EINVALID {
			t.Errorf("filter %+v: %v, want invalid", bad, err)
		}
	}
}

// newCheckNowBench: three stuck Registered sessions the gateway has captured.
func newCheckNowBench(t *testing.T, mod ...func(*payments.Config)) (*bench, []string) {
	b := newBench(t, mod...)
	var list []string
	for _, o := range []string{"o-cn-1", "o-cn-2", "o-cn-3"} {
		s := b.registered(t, o, 1200)
		b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
		list = append(list, s.ID)
	}
	b.clock.Advance(payments.SettleWithin)
	return b, list
}

// statusCalls counts the gateway's status calls per session (each session has its own
// gateway payment id).
func (b *bench) statusCalls(t *testing.T, sessionIDs []string) []int {
	t.Helper()
	out := make([]int, len(sessionIDs))
	for i, id := range sessionIDs {
		var gp string
		if err := b.pool.QueryRow(context.Background(), `SELECT gateway_payment_id FROM payment_sessions WHERE id = $1`, id).Scan(&gp); err != nil {
			t.Fatal(err)
		}
		out[i] = b.gw.PaymentCalls(fakegw.OpStatus, gp)
	}
	return out
}

type checkNowOut struct {
	res []payments.CheckNowResult
	err error
}

func goCheckNow(svc *payments.Service, by payments.Staff, list []string) <-chan checkNowOut {
	ch := make(chan checkNowOut, 1)
	go func() {
		res, err := svc.CheckNow(context.Background(), by, list)
		ch <- checkNowOut{res, err}
	}()
	return ch
}

// Two bulk "Check now" of the same rows at the same moment (a double click; two people; two
// replicas): the first is parked inside its claim transaction, the second is seen waiting for
// the first's claim rows in pg_locks, then the first commits. The gateway is asked ONCE per
// session; the second request asks nothing and says who is checking. Each payment is
// Completed once with one ledger entry.
func TestCheckNowTwoConcurrentBulkChecksAskOncePerSession(t *testing.T) {
	t.Parallel()
	claim := newParker()
	b, list := newCheckNowBench(t, func(c *payments.Config) {
		c.Hooks.AfterCheckNowClaim = func(ctx context.Context, ids []string) { claim.hook(ctx, "claimed") }
	})
	other := b.service(b.pool, "replica-b") // the second click, maybe on another replica
	first := goCheckNow(b.svc, financeStaff, list)
	mustWait(t, claim.arrived, "the first check holds its claim, uncommitted")
	second := goCheckNow(other, payments.Staff{Email: "fin2@example.com", Role: "finance"}, list)
	waitLockWaiters(t, b.pool, 1) // the second claim waits for the first's rows
	claim.let(1)
	r1, r2 := mustWait(t, first, "first check"), mustWait(t, second, "second check")
	if r1.err != nil || r2.err != nil {
		t.Fatalf("errors: %v, %v", r1.err, r2.err)
	}
	for i := range list {
		a, c := r1.res[i], r2.res[i]
		if !a.Checked || a.Err != nil || a.Before != payments.StatusRegistered || a.After != payments.StatusCompleted {
			t.Errorf("first, %s: %+v", list[i], a)
		}
		// The second click, once the first's claim commits, finds each session either still
		// being checked or already settled by the first (whichever its read meets: the first
		// checks the sessions one after another meanwhile). Never a second check.
		if c.Checked || c.Skipped != "being checked by fin@example.com (or checked just now)" && c.Skipped != "already Completed" {
			t.Errorf("second, %s: %+v", list[i], c)
		}
	}
	if calls := b.statusCalls(t, list); !slices.Equal(calls, []int{1, 1, 1}) {
		t.Fatalf("gateway status calls per session = %v, want one each", calls)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = ANY($1::uuid[])`, list); n != 3 {
		t.Fatalf("ledger entries = %d, want 3", n)
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = 'payment.check' AND detail LIKE 'check now:%'`); n != 3 {
		t.Fatalf("audited checks = %d, want 3", n)
	}
}

// naiveCheckNow is "Check now" without the claim: read whether someone is checking, then
// check. The negative control of the test above.
func naiveCheckNow(ctx context.Context, pool *pgxpool.Pool, svc *payments.Service, list []string, afterRead func(context.Context, string)) error {
	var busy int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM finance_check_claims WHERE session_id = ANY($1::uuid[]) AND until > $2`,
		list, svc.Now()).Scan(&busy); err != nil {
		return err
	}
	afterRead(ctx, "read")
	if busy > 0 {
		return nil
	}
	for _, id := range list {
		if _, err := pool.Exec(ctx, `INSERT INTO finance_check_claims (session_id, token, claimed_by, claimed_at, until)
			VALUES ($1, gen_random_uuid(), 'naive', $2, $3) ON CONFLICT (session_id) DO UPDATE SET until = excluded.until`,
			id, svc.Now(), svc.Now().Add(time.Minute)); err != nil {
			return err
		}
		if _, err := svc.Check(ctx, api, id); err != nil {
			return err
		}
	}
	return nil
}

// The negative control: two naive bulk checks that both read "nobody is checking" before either
// claims ask the gateway twice about every session. The counting above would catch that.
func TestCheckNowNaiveWithoutClaimAsksTwice(t *testing.T) {
	t.Parallel()
	b, list := newCheckNowBench(t)
	p := newParker()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- naiveCheckNow(context.Background(), b.pool, b.svc, list, p.hook) }()
	}
	mustWait(t, p.arrived, "naive read 1")
	mustWait(t, p.arrived, "naive read 2")
	p.let(2)
	for range 2 {
		if err := mustWait(t, errs, "naive check"); err != nil {
			t.Fatal(err)
		}
	}
	if calls := b.statusCalls(t, list); !slices.Equal(calls, []int{2, 2, 2}) {
		t.Fatalf("naive: gateway status calls per session = %v, want two each (the bug)", calls)
	}
}

// A click just after a check finished is still one look (the cooldown); after the cooldown
// the gateway is asked again. Settled, unknown and malformed ids are skipped with a reason; a
// gateway that does not answer is reported per row and releases the claim like any end.
func TestCheckNowCooldownAndSkips(t *testing.T) {
	t.Parallel()
	b, list := newCheckNowBench(t)
	ctx := context.Background()
	pending := b.registered(t, "o-cn-pending", 800)
	b.clock.Advance(payments.SettleWithin)

	res, err := b.svc.CheckNow(ctx, financeStaff, []string{list[0], list[0], pending.ID})
	if err != nil || len(res) != 2 || !res[0].Checked || res[0].After != payments.StatusCompleted ||
		!res[1].Checked || res[1].After != payments.StatusRegistered {
		t.Fatalf("check now = %+v, %v", res, err)
	}
	res, err = b.svc.CheckNow(ctx, financeStaff, []string{pending.ID})
	if err != nil || res[0].Checked || res[0].Skipped == "" {
		t.Fatalf("within the cooldown: %+v, %v", res, err)
	}
	b.clock.Advance(payments.CheckNowCooldown)
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	res, err = b.svc.CheckNow(ctx, financeStaff, []string{pending.ID, list[0], "nope", "00000000-0000-0000-0000-000000000000"})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; !r.Checked || payments.ErrorCode(r.Err) != payments.EUNAVAIL || r.After != payments.StatusRegistered {
		t.Errorf("gateway down: %+v", r)
	}
	if r := res[1]; r.Checked || r.Skipped != "already Completed" {
		t.Errorf("settled: %+v", r)
	}
	if res[2].Skipped != "no such payment" || res[3].Skipped != "no such payment" {
		t.Errorf("unknown ids: %+v %+v", res[2], res[3])
	}
	if calls := b.statusCalls(t, []string{list[0], pending.ID}); !slices.Equal(calls, []int{1, 2}) {
		t.Fatalf("status calls = %v, want [1 2]", calls)
	}
	if _, err := b.svc.CheckNow(ctx, financeStaff, nil); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("nothing selected: %v", err)
	}
	many := make([]string, payments.MaxCheckNow+1)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	if _, err := b.svc.CheckNow(ctx, financeStaff, many); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("too many: %v", err)
	}
}

// A caller that went away (a browser that dropped the first request of a double click) does not
// stop the checks it claimed: the answers are applied, not lost behind a claim.
func TestCheckNowSurvivesADroppedRequest(t *testing.T) {
	t.Parallel()
	b, list := newCheckNowBench(t)
	gate := b.gw.Hold(fakegw.OpStatus)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var res []payments.CheckNowResult
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, err = b.svc.CheckNow(ctx, financeStaff, list)
	}()
	for range list {
		mustWait(t, gate.Arrived(), "a status call at the gateway")
	}
	cancel() // the browser dropped the request
	gate.Open()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil || r.After != payments.StatusCompleted {
			t.Fatalf("after a dropped request: %+v", r)
		}
	}
}

// The browser drops the first POST of a double click while its claims are being written: the
// claims committed, the read after them was cut with the request, nothing was asked, and the
// second click was told each row was "being checked" for the cooldown — no look at all (an
// outside review of bulk actions). From the claim on, CheckNow outlives a hang-up: here the
// request's context ends inside the claim's transaction, and each payment is still asked once
// and applied. Negative control: with unlessHungUp taken after the claims, CheckNow fails
// ("context canceled") and no payment is asked.
func TestCheckNowOutlivesAHangUpDuringItsClaim(t *testing.T) {
	t.Parallel()
	var hangUp context.CancelFunc
	b, list := newCheckNowBench(t, func(c *payments.Config) {
		c.Hooks.AfterCheckNowClaim = func(context.Context, []string) { hangUp() }
	})
	ctx, cancel := context.WithCancel(context.Background())
	hangUp = cancel
	res, err := b.svc.CheckNow(ctx, financeStaff, list)
	if err != nil {
		t.Fatalf("CheckNow after a hang-up during its claim: %v", err)
	}
	for _, r := range res {
		if r.Err != nil || r.After != payments.StatusCompleted {
			t.Fatalf("after a hang-up during the claim: %+v", r)
		}
	}
	if got := b.statusCalls(t, list); !slices.Equal(got, []int{1, 1, 1}) {
		t.Fatalf("gateway status calls per payment = %v, want one each", got)
	}
}

// A full page of "Check now" while the gateway is slow: checks run four at a time, and one that
// could not finish within the claim's time is not started (it ran out half-way with "context
// deadline exceeded", and the whole request outlived the server's write timeout: an outside
// review). It is reported as not asked, its claim released so the next click asks; those
// started finish.
func TestCheckNowLeavesWhatNoLongerFitsUnasked(t *testing.T) {
	t.Parallel()
	b, list := newCheckNowBench(t)
	for _, o := range []string{"o-cn-4", "o-cn-5", "o-cn-6"} {
		s := b.registered(t, o, 1200)
		b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
		list = append(list, s.ID)
	}
	b.clock.Advance(payments.SettleWithin)
	gate := b.gw.Hold(fakegw.OpStatus)
	done := goCheckNow(b.svc, financeStaff, list)
	for range 4 { // four at a time: the first four wait for the gateway
		mustWait(t, gate.Arrived(), "a check at the gateway")
	}
	b.clock.Advance(b.svc.CheckNowClaimTTL() - 10*time.Second) // the gateway takes its time
	gate.Open()
	out := mustWait(t, done, "check now")
	if out.err != nil {
		t.Fatal(out.err)
	}
	var checked, unasked int
	for _, r := range out.res {
		switch {
		case r.Checked && r.Err == nil && r.After == payments.StatusCompleted:
			checked++
		case !r.Checked && strings.Contains(r.Skipped, "too slowly"):
			unasked++
		default:
			t.Errorf("%s: %+v", r.SessionID, r)
		}
	}
	if checked != 4 || unasked != 2 {
		t.Fatalf("checked %d, unasked %d; want 4 and 2", checked, unasked)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_check_claims WHERE until > $1`, b.clock.Now()); n != 4 {
		t.Fatalf("live claims = %d, want the 4 checked ones' cooldowns (the unasked released)", n)
	}
	// The next click asks about the two left.
	again, err := b.svc.CheckNow(context.Background(), financeStaff, list)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range again {
		if r.Checked {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("the next click checked %d, want the 2 left", n)
	}
}

// With a long GATEWAY_TIMEOUT (the configuration allows 10 minutes) the claim is long enough
// for a check to start and end inside it: with a fixed two minutes, every session came back
// "not asked" once the timeout passed about 105 s, and between about 40 s and 105 s a started
// check outlived its claim.
func TestCheckNowWithALongGatewayTimeout(t *testing.T) {
	t.Parallel()
	b, list := newCheckNowBench(t, func(c *payments.Config) { c.GatewayTimeout = 3 * time.Minute })
	if ttl := b.svc.CheckNowClaimTTL(); ttl < 2*(3*3*time.Minute) {
		t.Fatalf("claim TTL %s for a 3 min gateway timeout", ttl)
	}
	res, err := b.svc.CheckNow(context.Background(), financeStaff, list)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !r.Checked || r.Err != nil || r.After != payments.StatusCompleted {
			t.Fatalf("%+v: want every session asked and Completed", r)
		}
	}
}
