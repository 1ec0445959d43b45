package payments_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// chaos3 is the messier day (chaos2) with what it did not mix (an outside review, chaos3): staff
// disabled and ENABLED again (access.EnableUser) while their refund proposals wait; refund
// proposals filed and the shop refunding the same payment through the API before approval
// (approved or refused); reconciliation by a third replica whose gateway's search for one
// session never ends, racing the patrols, checks and staff cancels of that session; the finance
// pages (workbench, flagged, cases) read while the patrols settle, their totals against their
// rows and, once quiet, against SQL; a flaky notifier on both replicas with the outbox patrol and
// the housekeeping (RedactDeadCodes) while codes are superseded, consumed and their refunds'
// room taken; and the clock past leases, codes and key windows.
type chaos3 struct {
	*chaos2
	notifier *flakyNotifier
	rec      *payments.Service // replica-c: reconciliation only, its search for one ref endless
	endless  *endlessRef
}

// endlessRef is endlessSearch whose reference can change during the day.
type endlessRef struct {
	*fakegw.Gateway
	mu  sync.Mutex
	ref string
}

func (g *endlessRef) set(ref string) { g.mu.Lock(); g.ref = ref; g.mu.Unlock() }

func (g *endlessRef) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	g.mu.Lock()
	endless := ref != "" && ref == g.ref
	g.mu.Unlock()
	if endless {
		<-ctx.Done()
		return nil, &payments.GatewayError{Kind: payments.FailureUnknown, Op: "find", Err: ctx.Err()}
	}
	return g.Gateway.FindByReference(ctx, ref)
}

func (w *chaos3) setDown(down bool) {
	w.notifier.mu.Lock()
	w.notifier.down = down
	w.notifier.mu.Unlock()
}

// deadFailing lists failing messages (counted by Stats) whose code is dead, with the reason,
// by the claim's rules (notify.go, outboxSource).
func (w *chaos3) deadFailing(ctx context.Context) []string {
	return w.b.texts(w.t, `SELECT o.id || ' ' || o.kind || ' ' || CASE WHEN c.consumed_at IS NOT NULL THEN 'consumed'
			WHEN c.superseded_at IS NOT NULL THEN 'superseded'
			WHEN c.expires_at <= $1 THEN 'expired'
			WHEN c.attempts >= c.max_attempts THEN 'spent'
			WHEN c.action = 'cancel' AND ps.status IN ('Completed','Failed','Canceled') THEN 'finished'
			ELSE 'no_room' END
		FROM outbox o JOIN cancel_challenges c ON c.id = o.challenge_id JOIN payment_sessions ps ON ps.id = c.session_id
		WHERE o.delivered_at IS NULL AND o.skipped_at IS NULL AND o.attempts > 0 AND (o.lease_until IS NULL OR o.lease_until <= $1)
		  AND (c.consumed_at IS NOT NULL OR c.superseded_at IS NOT NULL OR c.expires_at <= $1 OR c.attempts >= c.max_attempts
		       OR c.action = 'cancel' AND ps.status IN ('Completed','Failed','Canceled')
		       OR c.action = 'refund' AND c.amount > ps.amount
		          - (SELECT coalesce(sum(r.amount), 0) FROM refunds r WHERE r.session_id = ps.id AND r.status <> 'Failed')
		          - coalesce((SELECT p.refund_amount FROM resolution_proposals p WHERE p.session_id = ps.id AND p.kind = 'refund' AND p.state = 'proposed'), 0))
		ORDER BY o.id`, w.b.clock.Now())
}

// housekeeping: the outbox patrol of both replicas and the housekeeping's redaction, then the
// failing count judged (nothing else runs meanwhile: one worker).
func (w *chaos3) housekeeping(ctx context.Context) {
	for _, svc := range w.svcs() {
		_, _ = svc.DeliverOutbox(ctx)
	}
	n, err := w.pickSvc().RedactDeadCodes(ctx, w.b.clock.Now(), 0)
	w.logf("housekeeping: redacted %d %v", n, err)
	// no_room included: the housekeeping left those until this review
	// (TestARefundCodeWithNoRoomStopsCountingAsFailing).
	for _, d := range w.deadFailing(ctx) {
		w.badf("outbox message %s: dead, yet counted as failing after housekeeping", d)
	}
}

func (w *chaos3) completedWithRoom(ctx context.Context, min int64) (string, int64, bool) {
	var id string
	var room int64
	err := w.b.pool.QueryRow(ctx, `SELECT s.id::text, s.amount - coalesce((SELECT sum(r.amount) FROM refunds r WHERE r.session_id = s.id AND r.status <> 'Failed'), 0)
		FROM payment_sessions s WHERE s.status = 'Completed' AND s.gateway_payment_id IS NOT NULL
		  AND NOT EXISTS (SELECT 1 FROM resolution_proposals p WHERE p.session_id = s.id AND p.state = 'proposed')
		  AND s.amount - coalesce((SELECT sum(r.amount) FROM refunds r WHERE r.session_id = s.id AND r.status <> 'Failed'), 0) >= $2
		ORDER BY md5(s.order_id || $1) LIMIT 1`, w.salt(), min).Scan(&id, &room)
	return id, room, err == nil
}

// pages reads the finance pages while settling happens and compares each page's figures with its
// own rows (every list fits on one page here).
func (w *chaos3) pages(ctx context.Context, svc *payments.Service, when string) {
	page, err := svc.StuckSessions(ctx, payments.StuckFilter{Limit: 500})
	if err == nil && page.Next == "" {
		var n int
		var sum int64
		for _, t := range page.Totals {
			n += t.Count
			sum += t.Amount
		}
		var rows int64
		for _, s := range page.Sessions {
			rows += s.Session.Amount
		}
		if n != len(page.Sessions) || sum != rows {
			w.badf("%s: workbench lists %d payments (%d) under totals of %d (%d)", when, len(page.Sessions), rows, n, sum)
		}
	}
	fl, err := svc.ListFlagged(ctx, "")
	if err == nil && fl.Next == "" && int(fl.Total) != len(fl.Sessions) {
		w.badf("%s: flagged list shows %d sessions under a total of %d", when, len(fl.Sessions), fl.Total)
	}
	cs, err := svc.ListCases(ctx, false, 0)
	if err == nil && cs.Next == 0 && int(cs.Open) != len(cs.Cases) {
		w.badf("%s: cases page lists %d open cases under a count of %d", when, len(cs.Cases), cs.Open)
	}
}

// pagesTruth: the pages against SQL when nothing moves.
func (w *chaos3) pagesTruth(ctx context.Context) {
	b := w.b
	page, err := w.pickSvc().StuckSessions(ctx, payments.StuckFilter{Limit: 500})
	if err != nil {
		w.badf("workbench: %v", err)
		return
	}
	var n int
	var sum int64
	for _, t := range page.Totals {
		n += t.Count
		sum += t.Amount
	}
	// SettleWithin is the workbench's minimum age; the page's own MinAge after normalize.
	var tn int
	var tsum int64
	_ = b.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0)::bigint FROM payment_sessions WHERE status IN ('Registering','Registered','Unknown','Authorized','Canceling') AND created_at <= $1`,
		b.clock.Now().Add(-page.Filter.MinAge)).Scan(&tn, &tsum)
	if n != tn || sum != tsum {
		w.badf("workbench totals %d (%d) but SQL has %d (%d) stuck", n, sum, tn, tsum)
	}
	fl, err := w.pickSvc().ListFlagged(ctx, "")
	if err == nil {
		if tr := b.count(w.t, `SELECT count(*) FROM payment_sessions WHERE flagged_at IS NOT NULL AND status IN ('Registering','Registered','Unknown','Authorized','Canceling')`); int(fl.Total) != tr {
			w.badf("flagged total %d, SQL %d", fl.Total, tr)
		}
	}
	cs, err := w.pickSvc().ListCases(ctx, false, 0)
	if err == nil {
		if tr := b.count(w.t, `SELECT count(*) FROM finance_cases WHERE resolved_at IS NULL`); int(cs.Open) != tr {
			w.badf("cases open %d, SQL %d", cs.Open, tr)
		}
	}
}

func (w *chaos3) thirdStep(ctx context.Context) {
	b := w.b
	switch a := w.intn(8); a {
	case 0: // a refund proposal, the shop refunding the same payment, then an approval (maybe across a disable and an enable)
		id, room, ok := w.completedWithRoom(ctx, 800)
		if !ok {
			return
		}
		proposer := w.users[w.intn(3)]
		if w.intn(4) != 0 {
			for _, u := range w.users[:3] {
				_, _ = w.acc.EnableUser(ctx, staffAdminUser, u.Email)
			}
		}
		amount := min(room, 800+100*int64(w.intn(3)))
		var dwg sync.WaitGroup
		if w.intn(4) == 0 { // disabled and enabled again while the proposal is on its way
			dwg.Add(1)
			go func() {
				defer dwg.Done()
				_, _ = w.acc.DisableUser(ctx, staffAdminUser, proposer.Email)
				_, _ = w.acc.EnableUser(ctx, staffAdminUser, proposer.Email)
			}()
		}
		fr, err := w.pickSvc().RefundByFinance(w.staffCtx(ctx, proposer), proposer, payments.StaffRefundInput{PaymentID: id, Amount: amount, Reason: "complaint C", IntentKey: uuid.NewString()})
		dwg.Wait()
		w.logf("chaos3 propose refund %s %d by %s: proposal %v refund %v: %v", id, amount, proposer.Email, fr.Proposal != nil, fr.Refund != nil, err)
		if err != nil || fr.Proposal == nil {
			return
		}
		pid := fr.Proposal.ID
		shop := int64(0)
		var shopRefund string
		if w.intn(3) != 0 {
			if f := w.intn(5); f < 2 {
				b.gw.Fail(fakegw.OpRefund, chaosFaults[f], 1)
			}
			shop = 100 * int64(1+w.intn(4))
			r, err := w.pickSvc().CreateRefund(ctx, api, payments.RefundInput{PaymentID: id, Amount: shop, RequestKey: "shop-" + uuid.NewString()})
			shopRefund = r.Refund.ID
			w.logf("chaos3 shop refund %s %d: %s %v", id, shop, r.Refund.Status, err)
		}
		switch w.intn(3) {
		case 0: // the proposer disabled and enabled again before the approval
			_, err1 := w.acc.DisableUser(ctx, staffAdminUser, proposer.Email)
			_, err2 := w.acc.EnableUser(ctx, staffAdminUser, proposer.Email)
			w.logf("chaos3 disable+enable %s: %v %v", proposer.Email, err1, err2)
		case 1: // disabled, then enabled at the same moment as the approval
			_, _ = w.acc.DisableUser(ctx, staffAdminUser, proposer.Email)
			dwg.Add(1)
			go func() { defer dwg.Done(); _, _ = w.acc.EnableUser(ctx, staffAdminUser, proposer.Email) }()
		}
		approver := w.users[w.intn(3)]
		for approver.Email == proposer.Email {
			approver = w.users[w.intn(3)]
		}
		_, err = w.pickSvc().ApproveResolution(w.staffCtx(ctx, approver), approver, pid)
		dwg.Wait()
		w.logf("chaos3 approve %d by %s: %v", pid, approver.Email, err)
		if err == nil && shopRefund != "" {
			var st string
			_ = b.pool.QueryRow(ctx, `SELECT status FROM refunds WHERE id = $1`, shopRefund).Scan(&st)
			if st != "Failed" {
				w.badf("proposal %d approved after the shop's API refund %s (%s) of the same payment %s", pid, shopRefund, st, id)
			}
		}
	case 1: // reconciliation with a search that never ends for one session, racing a check, a patrol and a staff cancel
		id, st, _, ok := w.randomSession()
		if !ok {
			return
		}
		w.endless.set(id)
		var wg sync.WaitGroup
		wg.Add(3)
		go func() {
			defer wg.Done()
			cfg := payments.ReconcileConfig{MaxFailures: 2, LeaderTTL: 300 * time.Millisecond}
			var rep payments.ReconcileReport
			var err error
			if w.intn(2) == 0 {
				rep, err = w.rec.ReconcileOnceWith(ctx, cfg)
			} else {
				rep, err = w.rec.ReconcileSince(ctx, 48*time.Hour, cfg)
			}
			w.logf("chaos3 reconcile (endless %s): checked %d errors %d skipped %d: %v", id, rep.Checked, rep.Errors, rep.Skipped, err)
		}()
		go func() {
			defer wg.Done()
			_, _ = w.pickSvc().Check(ctx, api, id)
			_, _ = w.pickSvc().SweepOnce(ctx)
		}()
		go func() {
			defer wg.Done()
			if !payments.Status(st).Active() {
				return
			}
			u := w.users[w.intn(3)]
			ch, err := w.pickSvc().RequestCancelOnce(w.staffCtx(ctx, u), u.Actor(), id, uuid.NewString())
			if err != nil {
				return
			}
			if f := w.intn(4); f < 2 {
				b.gw.Fail(fakegw.OpReverse, chaosFaults[f], 1)
			}
			_, err = w.pickSvc().ConfirmCancel(w.staffCtx(ctx, u), u.Actor(), id, ch.ID, w.code(id))
			w.logf("chaos3 staff cancel %s during reconcile: %v", id, err)
		}()
		wg.Wait()
		w.endless.set("")
		// the lease of replica-c's run (300 ms on the injected clock) passes
		b.clock.Advance(time.Second)
	case 2: // the finance pages read while both patrols settle
		var wg sync.WaitGroup
		for _, svc := range w.svcs() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = svc.SweepOnce(ctx)
				_, _ = svc.DriveRefunds(ctx)
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				w.pages(ctx, w.pickSvc(), "while settling")
			}
		}()
		wg.Wait()
		w.pagesTruth(ctx)
	case 3: // the notifier goes down or comes back; messages retried
		w.setDown(w.intn(2) == 0)
		for _, svc := range w.svcs() {
			_, _ = svc.DeliverOutbox(ctx)
		}
	case 4: // codes superseded and consumed while deliveries fail, then housekeeping
		w.setDown(true)
		id, _, ok := w.completedWithRoom(ctx, 300)
		if ok {
			form := payments.StaffRefundInput{PaymentID: id, Amount: 300, Reason: "r", IntentKey: uuid.NewString()}
			ch, err := w.pickSvc().RequestRefundCode(ctx, supportStaff, form)
			w.logf("chaos3 refund code %s: %v", id, err)
			if err == nil {
				switch w.intn(3) {
				case 0: // a newer code (another form)
					form.IntentKey = uuid.NewString()
					_, err := w.pickSvc().RequestRefundCode(ctx, supportStaff, form)
					w.logf("chaos3 refund code again %s: %v", id, err)
				case 1: // read out after all (the first delivery reached them)
					_, err := w.pickSvc().ConfirmRefund(ctx, supportStaff, id, ch.ID, w.code(id))
					w.logf("chaos3 refund code consumed %s: %v", id, err)
				default: // the shop refunds the rest through the API
					var room int64
					_ = b.pool.QueryRow(ctx, `SELECT s.amount - coalesce((SELECT sum(r.amount) FROM refunds r WHERE r.session_id = s.id AND r.status <> 'Failed'), 0) FROM payment_sessions s WHERE id = $1`, id).Scan(&room)
					if room > 0 {
						r, err := w.pickSvc().CreateRefund(ctx, api, payments.RefundInput{PaymentID: id, Amount: room, RequestKey: "rest-" + uuid.NewString()})
						w.logf("chaos3 shop refunds the rest %s %d: %s %v", id, room, r.Refund.Status, err)
					}
				}
			}
		}
		if sid, st, _, ok := w.randomSession(); ok && payments.Status(st).Active() {
			_, err := w.pickSvc().RequestCancel(ctx, api, sid)
			_, err2 := w.pickSvc().RequestCancel(ctx, api, sid) // a newer code
			w.logf("chaos3 two cancel codes %s: %v %v", sid, err, err2)
		}
		w.housekeeping(ctx)
	case 5: // a user disabled or enabled on their own
		u := w.users[w.intn(len(w.users))]
		if w.intn(2) == 0 {
			_, err := w.acc.EnableUser(ctx, staffAdminUser, u.Email)
			w.logf("chaos3 enable %s: %v", u.Email, err)
		} else {
			_, err := w.acc.DisableUser(ctx, staffAdminUser, u.Email)
			w.logf("chaos3 disable %s: %v", u.Email, err)
		}
	case 6: // the clock past a lease, a code, a key window
		d := []time.Duration{31 * time.Second, 11 * time.Minute, 25 * time.Hour}[w.intn(3)]
		if d == 25*time.Hour && w.bigJumps >= 2 {
			d = 11 * time.Minute
		}
		if d == 25*time.Hour {
			w.bigJumps++
			b.gw.ForgetRefundKeys()
		}
		b.clock.Advance(d)
		w.logf("chaos3 clock +%s", d)
	default:
		w.housekeeping(ctx)
	}
}

// TestAThirdMessyDayKeepsTheMoneyInvariants (an outside review, chaos3: it found a refund code
// with no room counted as failing after housekeeping): CHAOS3_SEED, CHAOS3_SEEDS
// (from 500), CHAOS3_STEPS (default 400) and CHAOS3_LOG=1.
func TestAThirdMessyDayKeepsTheMoneyInvariants(t *testing.T) {
	t.Parallel()
	seeds, _ := chaosSeeds("CHAOS3", 500)
	steps := 400
	if s := os.Getenv("CHAOS3_STEPS"); s != "" {
		fmt.Sscan(s, &steps)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runChaos3(t, seed, steps)
		})
	}
}

func runChaos3(t *testing.T, seed uint64, steps int) {
	ctx := context.Background()
	w := &chaos3{chaos2: &chaos2{staffChaos: &staffChaos{chaosWorld: &chaosWorld{t: t, rng: rand.New(rand.NewPCG(seed, 33))}, pages: map[string][]staffPage{}},
		foreign: map[string]bool{}, ignoreRef: map[string]bool{}}, notifier: &flakyNotifier{}}
	base := func(c *payments.Config) {
		c.SweepConcurrency = 4
		c.Backoff = []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 3 * time.Hour}
		c.RefundDirectLimit = map[string]int64{"EUR": 700}
		c.Notifier = w.notifier
	}
	w.b = newBench(t, base)
	w.b.svc = w.b.service(w.b.pool, "replica-a", base, func(c *payments.Config) {
		c.GatewayTimeout = 5 * time.Second
		c.Gateway = &lateGW{Gateway: w.b.gw, w: w.chaos2, self: 0, timeout: 5 * time.Second}
	})
	w.b.gw.SetKeyRetention(24 * time.Hour)
	w.other = w.b.service(testdb.Pool(t, w.b.url), "replica-b", base, func(c *payments.Config) {
		c.GatewayTimeout = 20 * time.Second
		c.Gateway = &lateGW{Gateway: w.b.gw, w: w.chaos2, self: 1, timeout: 20 * time.Second}
	})
	w.endless = &endlessRef{Gateway: w.b.gw}
	w.rec = w.b.service(testdb.Pool(t, w.b.url), "replica-c", base, func(c *payments.Config) { c.Gateway = w.endless })
	w.acc = access.New(w.b.pool, w.b.clock)
	w.acc.PasswordCost = 4
	if _, err := w.acc.CreateUser(ctx, payments.Staff{Email: "cli:test"}, staffAdminUser.Email, access.RoleAdmin, "correct horse battery staple"); err != nil {
		t.Fatal(err)
	}
	w.users = []payments.Staff{fin1, fin2, staffAdmin, supportStaff}
	for _, u := range w.users {
		if _, err := w.acc.CreateUser(ctx, payments.Staff{Email: "cli:test"}, u.Email, access.Role(u.Role), "correct horse battery staple"); err != nil {
			t.Fatal(err)
		}
	}
	w.start = w.b.clock.Now()
	started := time.Now()
	for range steps {
		switch r := w.intn(10); {
		case r < 3:
			w.step(ctx)
		case r < 5:
			w.staffStep(ctx)
		case r < 6:
			w.newStep(ctx)
		default:
			w.thirdStep(ctx)
		}
	}
	w.mu.Lock()
	w.lateArmed = 0
	w.mu.Unlock()
	// Everyone back (a waiting proposal of someone left disabled is withdrawn, as it should be).
	for _, u := range w.users {
		_, _ = w.acc.EnableUser(ctx, staffAdminUser, u.Email)
	}
	w.setDown(false)
	w.endDay(ctx)
	for range 6 {
		w.b.clock.Advance(10 * time.Minute)
		for _, svc := range w.svcs() {
			_, _ = svc.DeliverOutbox(ctx)
		}
		_, _ = w.b.svc.RedactDeadCodes(ctx, w.b.clock.Now(), 0)
	}
	bad := append([]string{}, w.bad...)
	for _, m := range chaosInvariants(t, w.b) {
		if known := knownByHand(t, w.b, m); known != "" {
			continue
		}
		if strings.Contains(m, "that names no session") {
			foreign := false
			for ref := range w.foreign {
				if strings.Contains(m, "reference "+ref+" ") {
					foreign = true
				}
			}
			if foreign {
				continue
			}
		}
		if strings.Contains(m, "gateway payments") && strings.HasPrefix(m, "session ") {
			if w.ignoreRef[strings.Fields(m)[1]] {
				continue
			}
		}
		bad = append(bad, m)
	}
	bad = append(bad, staffInvariants(t, w.b)...)
	// The day's end: nothing failing, nothing in clear that is dead, pages equal to SQL.
	if st, err := w.b.svc.Stats(ctx); err != nil || st.FailingMessages != 0 {
		bad = append(bad, fmt.Sprintf("at the day's end %d customer messages failing (%v)", st.FailingMessages, err))
		bad = append(bad, w.b.texts(t, `SELECT concat_ws(' | ', id, kind, attempts, next_attempt_at, last_error, skip_reason, challenge_id) FROM outbox WHERE delivered_at IS NULL AND skipped_at IS NULL AND attempts > 0`)...)
	}
	if n := w.b.count(t, `SELECT count(*) FROM outbox WHERE redacted_body IS NOT NULL AND body <> redacted_body`); n != 0 {
		bad = append(bad, fmt.Sprintf("at the day's end %d messages keep a dead code in clear", n))
	}
	// A refund proposal approved after an API refund it did not see (not Failed).
	bad = append(bad, w.b.texts(t, `SELECT 'proposal ' || p.id || ' approved after the shop refund ' || r.id || ' (' || r.status || ')'
		FROM resolution_proposals p JOIN refunds r ON r.session_id = p.session_id AND r.created_by LIKE 'api:%' AND r.status <> 'Failed'
		WHERE p.kind = 'refund' AND p.state = 'approved' AND p.refunds_seen IS NOT NULL AND NOT r.id = ANY(p.refunds_seen)
		  AND r.created_at < p.decided_at AND r.id <> coalesce(p.refund_id, '00000000-0000-0000-0000-000000000000'::uuid)`)...)
	// Every reversal at the gateway asked for by exactly one cancel.
	bad = append(bad, w.b.texts(t, `SELECT 'session ' || session_id || ' has ' || count(*) || ' reverse operations' FROM reverse_operations GROUP BY session_id HAVING count(*) > 1`)...)
	before := len(w.bad)
	w.pagesTruth(ctx)
	bad = append(bad, w.bad[before:]...)
	if len(bad) > 0 || os.Getenv("CHAOS3_LOG") != "" {
		for _, l := range w.log {
			t.Log(l)
		}
		for _, s := range bad {
			t.Errorf("seed %d: %s", seed, s)
		}
	}
	t.Logf("seed %d in %s: sessions %v; cases %v; refunds %v; proposals %v; outbox %v; audit %v", seed, time.Since(started).Round(time.Second),
		w.b.texts(t, `SELECT status || ':' || count(*) FROM payment_sessions GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || count(*) || '/' || count(resolved_at) FROM finance_cases GROUP BY kind ORDER BY 1`),
		w.b.texts(t, `SELECT status || ':' || count(*) FROM refunds GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || state || ':' || count(*) FROM resolution_proposals GROUP BY kind, state ORDER BY 1`),
		w.b.texts(t, `SELECT k || ':' || count(*) FROM (SELECT coalesce(skip_reason, CASE WHEN delivered_at IS NOT NULL THEN 'delivered' ELSE 'pending' END) AS k FROM outbox) x GROUP BY k ORDER BY 1`),
		w.b.texts(t, `SELECT action || ':' || count(*) FROM audit_log WHERE action LIKE 'user.%' OR action LIKE 'resolution.%' GROUP BY action ORDER BY 1`))
}
