package payments_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// chaosWorld is one messy day: two replicas over one database and one gateway.
type chaosWorld struct {
	t      *testing.T
	b      *bench
	other  *payments.Service
	mu     sync.Mutex
	rng    *rand.Rand
	orders []string
	log    []string
	// midWork: when set, the next gateway status answer seen by replica-a lets its lease run
	// out and replica-b's patrol run before the answer is applied.
	midWork   bool
	inMidWork bool
	start     time.Time // the clock when the day began
}

func (w *chaosWorld) intn(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.IntN(n)
}

func (w *chaosWorld) logf(format string, args ...any) {
	w.mu.Lock()
	w.log = append(w.log, fmt.Sprintf("%s ", w.b.clock.Now().Format("15:04:05"))+fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

func (w *chaosWorld) svcs() []*payments.Service { return []*payments.Service{w.b.svc, w.other} }

func (w *chaosWorld) pickSvc() *payments.Service { return w.svcs()[w.intn(2)] }

// sessionsOf lists an order's sessions (id, status, gateway payment id).
func (w *chaosWorld) sessions() [][3]string {
	rows, err := w.b.pool.Query(context.Background(), `SELECT id::text, status, coalesce(gateway_payment_id, '') FROM payment_sessions ORDER BY created_at, id`)
	if err != nil {
		w.t.Error(err) // from a worker's goroutine: no FailNow
		return nil
	}
	defer rows.Close()
	var out [][3]string
	for rows.Next() {
		var r [3]string
		_ = rows.Scan(&r[0], &r[1], &r[2])
		out = append(out, r)
	}
	return out
}

func (w *chaosWorld) randomSession() (id, status, gp string, ok bool) {
	ss := w.sessions()
	if len(ss) == 0 {
		return "", "", "", false
	}
	s := ss[w.intn(len(ss))]
	return s[0], s[1], s[2], true
}

var chaosFaults = []fakegw.Fault{fakegw.LostAnswer, fakegw.Transient, fakegw.NotSent}

func (w *chaosWorld) step(ctx context.Context) {
	b := w.b
	switch a := w.intn(27); {
	case a >= 23: // finance and pages: retry flagged, check now, the checkout page looks, a webhook by reference only
		id, _, _, ok := w.randomSession()
		if !ok {
			return
		}
		switch a {
		case 23:
			_, err := w.pickSvc().RetryFlagged(ctx, fin1, id)
			w.logf("retry flagged %s: %v", id, err)
			var rid string
			if b.pool.QueryRow(ctx, `SELECT id::text FROM refunds WHERE flagged_at IS NOT NULL AND status = 'Pending' LIMIT 1`).Scan(&rid) == nil {
				_, err := w.pickSvc().RetryFlaggedRefund(ctx, fin1, rid)
				w.logf("retry flagged refund %s: %v", rid, err)
			}
		case 24:
			if w.intn(2) == 0 {
				b.gw.Fail(fakegw.OpStatus, fakegw.LostAnswer, 1)
			}
			_, err := w.pickSvc().CheckNow(ctx, fin1, []string{id})
			w.logf("check now %s: %v", id, err)
		case 25:
			_, err := w.pickSvc().CheckFromPage(ctx, payments.Actor{Kind: payments.ActorCustomer, ID: "page"}, id)
			w.logf("page look %s: %v", id, err)
		default:
			ids := w.gatewayIDsOf(id)
			if len(ids) == 0 {
				return
			}
			ev := fmt.Sprintf("evt_ref_%s_%d", ids[0], w.intn(2))
			_, err := w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: ev, Type: "payment.updated", PaymentID: ids[0], Reference: id})
			w.logf("webhook %s: %v", ev, err)
		}
	case a < 3: // a shop creates a payment (new order, or a retry / a second payment of an old one)
		var order string
		w.mu.Lock()
		if len(w.orders) == 0 || w.rng.IntN(3) == 0 {
			order = fmt.Sprintf("chaos-%d", len(w.orders))
			w.orders = append(w.orders, order)
		} else {
			order = w.orders[w.rng.IntN(len(w.orders))]
		}
		w.mu.Unlock()
		if f := w.intn(6); f < 3 {
			b.gw.Fail(fakegw.OpRegister, chaosFaults[f], 1)
		}
		amount := int64(1000 + 100*(len(order)%3))
		in := payments.CreateInput{OrderID: order, Amount: amount, Currency: "EUR", CustomerContact: "c@example.com"}
		if w.intn(3) == 0 { // two identical creates at once (two clicks, two replicas)
			var wg sync.WaitGroup
			for _, svc := range w.svcs() {
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = svc.Create(ctx, api, in) }()
			}
			wg.Wait()
			w.logf("create x2 %s", order)
		} else if w.intn(2) == 0 {
			_, err := w.pickSvc().CheckoutPay(ctx, uuid.NewString(), in, 0)
			w.logf("checkout pay %s: %v", order, err)
		} else {
			r, err := w.pickSvc().Create(ctx, api, in)
			w.logf("create %s: %s %v", order, r.Session.Status, err)
		}
	case a < 6: // the customer acts at the gateway
		id, _, gp, ok := w.randomSession()
		if !ok {
			return
		}
		if gp == "" {
			// the gateway may know it by reference only
			ids := w.gatewayIDsOf(id)
			if len(ids) == 0 {
				return
			}
			gp = ids[0]
		}
		p, _ := b.gw.Payment(gp)
		var to payments.GatewayStatus
		switch p.Status {
		case payments.GatewayPending:
			to = []payments.GatewayStatus{payments.GatewayAuthorized, payments.GatewaySucceeded, payments.GatewayDeclined, payments.GatewayExpired}[w.intn(4)]
		case payments.GatewayAuthorized:
			to = []payments.GatewayStatus{payments.GatewaySucceeded, payments.GatewaySucceeded, payments.GatewayExpired}[w.intn(3)]
		default:
			return
		}
		b.gw.SetStatus(gp, to)
		w.logf("gateway %s (%s) %s -> %s", gp, id, p.Status, to)
		if w.intn(2) == 0 { // its webhook, maybe twice
			ev := fmt.Sprintf("evt_%s_%s", gp, to)
			_, err := w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: ev, Type: "payment.updated", PaymentID: gp, Reference: id})
			w.logf("webhook %s: %v", ev, err)
		}
	case a < 7: // a late or duplicated webhook for anything
		id, _, gp, ok := w.randomSession()
		if !ok {
			return
		}
		if gp == "" {
			ids := w.gatewayIDsOf(id)
			if len(ids) == 0 {
				return
			}
			gp = ids[0]
		}
		ev := fmt.Sprintf("evt_%s_%d", gp, w.intn(3))
		_, err := w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: ev, Type: "payment.updated", PaymentID: gp, Reference: id})
		w.logf("late webhook %s: %v", ev, err)
	case a < 9: // the shop checks (sometimes beside a patrol)
		id, _, _, ok := w.randomSession()
		if !ok {
			return
		}
		if w.intn(3) == 0 {
			b.gw.Fail(fakegw.OpStatus, chaosFaults[w.intn(2)], 1)
		}
		if w.intn(2) == 0 {
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = w.other.Check(ctx, api, id) }()
			go func() { defer wg.Done(); _, _ = b.svc.Check(ctx, api, id) }()
			wg.Wait()
			w.logf("check x2 %s", id)
		} else {
			s, err := w.pickSvc().Check(ctx, api, id)
			w.logf("check %s: %s %v", id, s.Status, err)
		}
	case a < 10: // support cancels with a code the customer reads out
		id, _, _, ok := w.randomSession()
		if !ok {
			return
		}
		ch, err := w.pickSvc().RequestCancel(ctx, api, id)
		if err != nil {
			w.logf("cancel request %s: %v", id, err)
			return
		}
		if f := w.intn(4); f < 2 {
			b.gw.Fail(fakegw.OpReverse, chaosFaults[f], 1)
		}
		code := w.code(id)
		if w.intn(3) == 0 {
			var wg sync.WaitGroup
			for _, svc := range w.svcs() {
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = svc.ConfirmCancel(ctx, api, id, ch.ID, code) }()
			}
			wg.Wait()
			w.logf("cancel confirm x2 %s", id)
		} else {
			r, err := w.pickSvc().ConfirmCancel(ctx, api, id, ch.ID, code)
			w.logf("cancel confirm %s: %s %v", id, r.Session.Status, err)
		}
	case a < 13: // refunds (10: a little more often): the API (with and without keys, retried) or the console
		id, st, _, ok := w.randomSession()
		if !ok || st != "Completed" {
			return
		}
		if f := w.intn(5); f < 2 {
			b.gw.Fail(fakegw.OpRefund, chaosFaults[f], 1)
		}
		if w.intn(4) == 0 {
			b.gw.SetRefundOutcome("pending")
		} else {
			b.gw.SetRefundOutcome("succeeded")
		}
		amount := int64(100 * (1 + w.intn(6)))
		switch w.intn(3) {
		case 0:
			key := "k-" + id + "-" + strconv.Itoa(w.intn(3))
			r, err := w.pickSvc().CreateRefund(ctx, api, payments.RefundInput{PaymentID: id, Amount: amount, RequestKey: key})
			w.logf("api refund %s %d key %s: %s %v", id, amount, key, r.Refund.Status, err)
			if w.intn(2) == 0 { // the retry
				r, err = w.pickSvc().CreateRefund(ctx, api, payments.RefundInput{PaymentID: id, Amount: amount, RequestKey: key})
				w.logf("api refund retry %s: %s %v", id, r.Refund.Status, err)
			}
		case 1:
			r, err := w.pickSvc().RefundByFinance(ctx, fin1, payments.StaffRefundInput{PaymentID: id, Amount: amount, Reason: "customer asked", IntentKey: uuid.NewString()})
			w.logf("finance refund %s %d: %+v %v", id, amount, r.Refund != nil, err)
		default:
			form := payments.StaffRefundInput{PaymentID: id, Amount: amount, Reason: "customer asked", IntentKey: uuid.NewString()}
			ch, err := w.pickSvc().RequestRefundCode(ctx, supportStaff, form)
			if err != nil {
				w.logf("refund code %s: %v", id, err)
				return
			}
			r, err := w.pickSvc().ConfirmRefund(ctx, supportStaff, id, ch.ID, w.code(id))
			w.logf("support refund %s %d: %s %v", id, amount, r.Refund.Status, err)
		}
	case a < 15: // the patrols of both replicas, and the refund drives
		if w.intn(3) == 0 {
			b.gw.Fail(fakegw.OpStatus, chaosFaults[w.intn(2)], 1+w.intn(2))
		}
		if w.intn(4) == 0 {
			w.mu.Lock()
			w.midWork = true
			w.mu.Unlock()
		}
		var wg sync.WaitGroup
		for _, svc := range w.svcs() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = svc.SweepOnce(ctx)
				_, _ = svc.DriveRefunds(ctx)
			}()
		}
		wg.Wait()
		w.logf("patrol round")
	case a < 15+2: // finance settles a flagged session by four eyes (sometimes wrongly), or the gateway misstates an amount
		if w.intn(4) == 0 {
			id, _, gp, ok := w.randomSession()
			if ok && gp != "" {
				b.gw.SetAmount(gp, 999, "EUR")
				w.logf("gateway misstates %s (%s) as 999 EUR", gp, id)
			}
			return
		}
		var id string
		if err := b.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE flagged_at IS NOT NULL AND status IN ('Registering','Registered','Unknown','Authorized','Canceling') ORDER BY md5(order_id || $1), created_at LIMIT 1`, w.salt()).Scan(&id); err != nil {
			return
		}
		outcome := []payments.Status{payments.StatusCompleted, payments.StatusFailed, payments.StatusCanceled}[w.intn(3)]
		r, err := w.pickSvc().ProposeResolution(ctx, fin1, payments.ProposalInput{SessionID: id, Outcome: outcome, Reason: "gateway support says so", Evidence: "ticket FIN-2"})
		w.logf("propose %s %s: %v", id, outcome, err)
		if err == nil {
			_, err = w.pickSvc().ApproveResolution(ctx, fin2, r.ID)
			w.logf("approve %d: %v", r.ID, err)
		}
	case a < 16+2: // reconciliation
		rep, err := w.pickSvc().ReconcileOnce(ctx)
		w.logf("reconcile: %+v %v", rep, err)
	case a < 17+2: // finance resolves a case
		var id int64
		if err := b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE resolved_at IS NULL ORDER BY md5(coalesce(order_id, '') || kind || $1), created_at LIMIT 1`, w.salt()).Scan(&id); err != nil {
			return
		}
		_, err := w.pickSvc().ResolveCase(ctx, fin1, id, "handled at the gateway, ticket FIN-1", "")
		w.logf("resolve case %d: %v", id, err)
	case a < 18+2:
		_, err := w.pickSvc().Prune(ctx, payments.PruneConfig{GatewayCalls: time.Hour, WebhookEvents: time.Hour, Outbox: time.Hour, Actor: "cli:test"})
		w.logf("prune: %v", err)
	default:
		d := time.Duration(1+w.intn(600)) * time.Second
		if w.intn(5) == 0 && b.clock.Now().Sub(w.start) < 72*time.Hour {
			// Hours at a time for the first three days only: the day's end adds 93 hours, and
			// a day past reconciliation's 7-day lookback would leave a lost webhook's late
			// capture to nobody by design.
			d = time.Duration(1+w.intn(6)) * time.Hour
		}
		b.clock.Advance(d)
	}
}

// gwRefundsOf lists the statuses of a gateway payment's refunds at the gateway. (fakegw numbers
// payments and refunds in one sequence: registrations count towards the last refund's number.)
func (w *chaosWorld) gwRefundsOf(gp string) []string {
	var out []string
	for i := 1; i < w.b.gw.Calls(fakegw.OpRegister)+w.b.gw.Calls(fakegw.OpRefund)+10; i++ {
		r, err := w.b.gw.RefundStatus(context.Background(), "rf_fake_"+strconv.Itoa(i))
		if err == nil && r.PaymentID == gp {
			out = append(out, r.Status)
		}
	}
	return out
}

// failedRefundPayments are the gateway payments with a refund the gateway failed.
func (w *chaosWorld) failedRefundPayments() map[string]bool {
	out := map[string]bool{}
	for i := 1; i < w.b.gw.Calls(fakegw.OpRegister)+w.b.gw.Calls(fakegw.OpRefund)+10; i++ {
		if r, err := w.b.gw.RefundStatus(context.Background(), "rf_fake_"+strconv.Itoa(i)); err == nil && r.Status == "failed" {
			out[r.PaymentID] = true
		}
	}
	return out
}

// gatewayIDsOf lists the gateway payments carrying a reference.
func (w *chaosWorld) gatewayIDsOf(ref string) []string {
	var out []string
	for i := 1; ; i++ {
		id := "gp_fake_" + strconv.Itoa(i)
		p, ok := w.b.gw.Payment(id)
		if !ok {
			if i > w.b.gw.Calls(fakegw.OpRegister)+w.b.gw.Calls(fakegw.OpRefund)+10 {
				return out
			}
			continue
		}
		if p.Reference == ref {
			out = append(out, id)
		}
	}
}

// TestAMessyDayKeepsTheMoneyInvariants runs seeded messy days (runChaos: creates with and
// without keys, checkout clicks, customers at the gateway, webhooks duplicated, late and by
// reference only, checks and cancels racing, refunds of every kind, two replicas' patrols with a
// lease running out mid-work, reconciliation, finance resolving cases and settling by four
// eyes, clock jumps, prune) and checks the money from the database and the gateway's own
// records (chaosInvariants). Written by an outside review of the whole (it found nothing);
// kept so the next change meets it. CHAOS_SEED=N (one seed), CHAOS_SEEDS=N, CHAOS_STEPS and
// CHAOS_WORKERS widen it; a seed picks the same steps, not the same interleaving (the two
// replicas' patrols run at once), so a failure is reported with the day's log to reduce;
// make polygon runs 12 seeds of 1,000 steps. Negative control: a refund's RefundIssued entry
// written only when the API settles it (not the patrol, not the console): seed 1 fails.
func TestAMessyDayKeepsTheMoneyInvariants(t *testing.T) {
	t.Parallel()
	seeds, steps := chaosSeeds("CHAOS", 100)
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runChaos(t, seed, steps)
		})
	}
}

func (w *chaosWorld) code(sessionID string) string {
	var body string
	if err := w.b.pool.QueryRow(context.Background(), `SELECT body FROM outbox WHERE payment_id = $1 AND kind IN ('cancel_code', 'refund_code') ORDER BY id DESC LIMIT 1`, sessionID).Scan(&body); err != nil {
		return "000000"
	}
	if m := codeRe.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return "000000"
}

func runChaos(t *testing.T, seed uint64, steps int) {
	workers := 1
	if s := os.Getenv("CHAOS_WORKERS"); s != "" {
		workers, _ = strconv.Atoi(s)
	}
	ctx := context.Background()
	w := &chaosWorld{t: t, rng: rand.New(rand.NewPCG(seed, 99))}
	mod := func(c *payments.Config) {
		c.LeaseDuration, c.GatewayTimeout = 30*time.Second, 5*time.Second
		c.SweepConcurrency = 4
		c.Backoff = []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 3 * time.Hour}
		c.RefundDirectLimit = map[string]int64{"EUR": 1_000_000}
	}
	w.b = newBench(t, mod, func(c *payments.Config) {
		c.Hooks.AfterGatewayStatus = func(ctx context.Context, id string, gp payments.GatewayPayment) {
			w.mu.Lock()
			go_ := w.midWork && !w.inMidWork
			if go_ {
				w.midWork, w.inMidWork = false, true
			}
			w.mu.Unlock()
			if !go_ {
				return
			}
			// replica-a's lease runs out while the answer travels; replica-b takes the session.
			w.b.clock.Advance(31 * time.Second)
			_, _ = w.other.SweepOnce(context.Background())
			w.logf("mid-work: replica-a's lease on %s ran out; replica-b swept", id)
			w.mu.Lock()
			w.inMidWork = false
			w.mu.Unlock()
		}
	})
	w.other = w.b.service(testdb.Pool(t, w.b.url), "replica-b", mod, func(c *payments.Config) {
		c.Hooks.AfterCancelCommit = func(ctx context.Context, id string) {
			if w.intn(3) != 0 {
				return
			}
			// the customer's payment is captured while our reverse is on its way
			for _, gp := range w.gatewayIDsOf(id) {
				if p, _ := w.b.gw.Payment(gp); p.Status == payments.GatewayPending || p.Status == payments.GatewayAuthorized {
					w.b.gw.SetStatus(gp, payments.GatewaySucceeded)
					w.logf("captured %s (%s) as the cancel committed", gp, id)
				}
			}
		}
	})
	if os.Getenv("CHAOS_LATENCY") != "" {
		d, _ := time.ParseDuration(os.Getenv("CHAOS_LATENCY"))
		w.b.gw.SetLatency(d)
	}
	w.start = w.b.clock.Now()
	// A shop follows the feed the whole day, a few events at a time (every third step).
	var feedMu sync.Mutex
	seen := map[string]int{}
	cursor := ""
	readFeed := func() {
		for {
			page, err := w.other.Feed(ctx, cursor, 7)
			if err != nil {
				t.Errorf("feed: %v", err)
				return
			}
			for _, e := range page.Events {
				seen[e.Cursor]++
			}
			cursor = page.Next
			if !page.More {
				return
			}
		}
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range steps / workers {
				w.step(ctx)
				if i%3 == 0 {
					feedMu.Lock()
					readFeed()
					feedMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	w.endDay(ctx)
	all := w.b.texts(t, `SELECT xid::text || '-' || id FROM session_events UNION ALL SELECT xid::text || '-' || id FROM refund_events`)
	// The feed lags behind the oldest transaction of the cluster (other tests' too): read until
	// everything is served, or a gap stays.
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); { // as feedAllOf
		readFeed()
		missing := 0
		for _, c := range all {
			if seen[c] == 0 {
				missing++
			}
		}
		if missing == 0 {
			break
		}
	}
	for _, c := range all {
		if seen[c] != 1 {
			t.Errorf("seed %d: feed event %s read %d times", seed, c, seen[c])
		}
		delete(seen, c)
	}
	for c := range seen {
		t.Errorf("seed %d: feed served %s, which is no event", seed, c)
	}
	t.Logf("seed %d: feed events %d", seed, len(all))
	if bad := chaosInvariants(t, w.b); len(bad) > 0 {
		for _, l := range w.log {
			t.Log(l)
		}
		for _, s := range bad {
			t.Errorf("seed %d: %s", seed, s)
		}
	}
	checkInvariants(t, w.b)
	t.Logf("seed %d summary: %v; cases %v; refunds %v; reverses %d", seed,
		w.b.texts(t, `SELECT status || ':' || count(*) FROM payment_sessions GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || count(*) || '/' || count(resolved_at) FROM finance_cases GROUP BY kind ORDER BY 1`),
		w.b.texts(t, `SELECT status || ':' || count(*) FROM refunds GROUP BY status ORDER BY 1`),
		w.b.count(t, `SELECT count(*) FROM reverse_operations`))
}

func chaosInvariants(t *testing.T, b *bench) []string {
	ctx := context.Background()
	var bad []string
	q := func(sql string, args ...any) int { return b.count(t, sql, args...) }
	for i := 1; i < 2000; i++ {
		id := "gp_fake_" + strconv.Itoa(i)
		p, ok := b.gw.Payment(id)
		if !ok {
			continue
		}
		ref := p.Reference
		var status, own string
		if err := b.pool.QueryRow(ctx, `SELECT status, coalesce(gateway_payment_id, '') FROM payment_sessions WHERE id = $1`, ref).Scan(&status, &own); err != nil {
			bad = append(bad, fmt.Sprintf("gateway payment %s has reference %s that names no session", id, ref))
			continue
		}
		naming := `SELECT count(*) FROM finance_cases c WHERE c.session_id = $1 AND EXISTS (SELECT 1 FROM unnest(c.facts) f WHERE f LIKE $2 || ' (%')`
		cases := q(naming, ref, id)
		open := q(naming+` AND c.resolved_at IS NULL`, ref, id)
		anyCase := q(`SELECT count(*) FROM finance_cases WHERE session_id = $1`, ref)
		switch p.Status {
		case payments.GatewaySucceeded:
			ledger := own == id && status == "Completed" && q(`SELECT count(*) FROM accounting_entries WHERE session_id = $1 AND entry_type = 'PaymentReceived' AND amount = $2`, ref, p.Amount) == 1
			if !ledger && cases == 0 {
				bad = append(bad, fmt.Sprintf("captured %s (session %s %s, own %q) neither in the ledger nor in a case naming it (cases of the session: %d)", id, ref, status, own, anyCase))
			}
			if ledger && q(`SELECT count(*) FROM finance_cases c WHERE c.session_id = $1 AND kind IN ('late_payment','duplicate_gateway_payment') AND resolved_at IS NULL AND EXISTS (SELECT 1 FROM unnest(c.facts) f WHERE f LIKE $2 || ' (%')`, ref, id) > 0 {
				bad = append(bad, fmt.Sprintf("captured %s is in the ledger and in an open late/duplicate case", id))
			}
			if q(naming+` AND c.resolved_at IS NULL AND c.kind IN ('late_payment', 'duplicate_gateway_payment')`, ref, id) > 1 {
				bad = append(bad, fmt.Sprintf("captured %s is named by %d open cases", id, open))
				for _, e := range b.texts(t, `SELECT concat_ws(' | ', c.id, kind, c.created_at, resolved_at, facts::text, c.detail) FROM finance_cases c WHERE session_id = $1 ORDER BY c.id`, ref) {
					bad = append(bad, "    case: "+e)
				}
				for _, e := range b.texts(t, `SELECT concat_ws(' | ', created_at, from_status, to_status, actor_kind, actor_id, reason) FROM session_events WHERE session_id = $1 ORDER BY id`, ref) {
					bad = append(bad, "    event: "+e)
				}
			}
		case payments.GatewayReversed:
			if n := q(`SELECT count(*) FROM reverse_operations WHERE session_id = $1`, ref); n != 1 {
				bad = append(bad, fmt.Sprintf("reversed %s (session %s) has %d reverse operations", id, ref, n))
			}
		}
		if status == "Completed" && own == id && p.Status != payments.GatewaySucceeded && q(`SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch'`, ref) == 0 {
			bad = append(bad, fmt.Sprintf("session %s Completed but its gateway payment %s is %s, no mismatch case", ref, id, p.Status))
		}
		if n := b.gw.PaymentsWithReference(ref); n > 1 {
			bad = append(bad, fmt.Sprintf("session %s has %d gateway payments", ref, n))
		}
	}
	// Refunds at the gateway: one row, one ledger entry. The row names the gateway refund, or —
	// Pending without a gateway id, the refund whose request made it (the key) — is where finance
	// settles it: its first send processed with the answer lost and every look of the schedule
	// unanswered, it is flagged without the id, by design (a CI day; the flagged list shows it,
	// the gateway finds it by the key, TestChaosInvariantsTakeAFlaggedRefundWithoutItsIDAsItsRow).
	for i := 1; i < 2000; i++ {
		rid := "rf_fake_" + strconv.Itoa(i)
		r, err := b.gw.RefundStatus(ctx, rid)
		if err != nil {
			continue
		}
		key := b.gw.RefundKey(rid)
		rows := q(`SELECT count(*) FROM refunds WHERE gateway_refund_id = $1 OR gateway_refund_id IS NULL AND status = 'Pending' AND id::text = $2`, rid, key)
		if rows != 1 {
			// What a failure needs to be read from a CI log alone (a seed's day is not replayed
			// exactly under another load): the key it was made with, the payment's refunds,
			// their events and refund calls, and its session's cases, in the one message (the
			// days sort their findings by message).
			m := fmt.Sprintf("gateway refund %s (%s, %d of %s) has %d refund rows (made with key %q)", rid, r.Status, r.Amount, r.PaymentID, rows, key)
			for _, e := range b.texts(t, `SELECT concat_ws(' | ', r.id, r.amount, r.status, r.gateway_refund_id, r.created_by, r.created_at, r.flagged_at, r.flag_reason, r.check_attempts, r.next_check_at, r.detail)
				FROM refunds r JOIN payment_sessions s ON s.id = r.session_id WHERE s.gateway_payment_id = $1 OR r.id::text = $2 ORDER BY r.created_at`, r.PaymentID, key) {
				m += "\n        refund: " + e
			}
			for _, e := range b.texts(t, `SELECT concat_ws(' | ', e.refund_id, e.created_at, e.from_status, e.to_status, e.actor_kind, e.actor_id) FROM refund_events e
				JOIN refunds r ON r.id = e.refund_id JOIN payment_sessions s ON s.id = r.session_id WHERE s.gateway_payment_id = $1 ORDER BY e.id`, r.PaymentID) {
				m += "\n        event: " + e
			}
			for _, e := range b.texts(t, `SELECT concat_ws(' | ', c.id, c.operation, c.idempotency_key, c.outcome, c.http_status, c.replica_id, c.created_at, c.detail) FROM gateway_calls c
				JOIN payment_sessions s ON s.id = c.session_id WHERE s.gateway_payment_id = $1 AND c.operation LIKE '%refund%' ORDER BY c.id`, r.PaymentID) {
				m += "\n        call: " + e
			}
			for _, e := range b.texts(t, `SELECT concat_ws(' | ', c.id, c.kind, c.created_at, c.resolved_at, c.facts::text, c.detail) FROM finance_cases c
				JOIN payment_sessions s ON s.id = c.session_id WHERE s.gateway_payment_id = $1 ORDER BY c.id`, r.PaymentID) {
				m += "\n        case: " + e
			}
			bad = append(bad, m)
			continue
		}
		if r.Status == "succeeded" && q(`SELECT count(*) FROM refunds WHERE (gateway_refund_id = $1 OR gateway_refund_id IS NULL AND id::text = $2)
			AND status = 'Pending' AND flagged_at IS NOT NULL`, rid, key) == 0 {
			if n := q(`SELECT count(*) FROM accounting_entries a JOIN refunds r ON r.id = a.refund_id WHERE r.gateway_refund_id = $1 AND a.entry_type = 'RefundIssued'`, rid); n != 1 {
				bad = append(bad, fmt.Sprintf("gateway refund %s succeeded, %d RefundIssued entries", rid, n))
				for _, e := range b.texts(t, `SELECT concat_ws(' | ', id, session_id, status, amount, created_by, flagged_at, check_attempts, next_check_at, created_at, updated_at, detail) FROM refunds WHERE gateway_refund_id = $1`, rid) {
					bad = append(bad, "    refund: "+e)
				}
				for _, e := range b.texts(t, `SELECT concat_ws(' | ', e.created_at, e.from_status, e.to_status, e.actor_kind) FROM refund_events e JOIN refunds r ON r.id = e.refund_id WHERE r.gateway_refund_id = $1 ORDER BY e.id`, rid) {
					bad = append(bad, "    event: "+e)
				}
				for _, e := range b.texts(t, `SELECT concat_ws(' | ', c.id, kind, c.created_at, resolved_at, facts::text, c.detail) FROM finance_cases c JOIN refunds r ON r.session_id = c.session_id WHERE r.gateway_refund_id = $1 ORDER BY c.id`, rid) {
					bad = append(bad, "    case: "+e)
				}
			}
		}
	}
	if n := q(`SELECT count(*) FROM refunds WHERE status = 'Succeeded' AND gateway_refund_id IS NULL`); n != 0 {
		bad = append(bad, fmt.Sprintf("%d Succeeded refunds without a gateway refund", n))
	}
	if n := q(`SELECT count(*) FROM (SELECT s.id FROM payment_sessions s JOIN accounting_entries a ON a.session_id = s.id
		GROUP BY s.id, s.amount HAVING sum(a.amount) FILTER (WHERE a.entry_type = 'RefundIssued') > s.amount) x`); n != 0 {
		bad = append(bad, fmt.Sprintf("%d sessions refunded more than received", n))
	}
	// The timeline: each event starts where the last ended, and the last ends at the status.
	rows, err := b.pool.Query(ctx, `SELECT s.id::text, s.status, coalesce(e.from_status, ''), e.to_status FROM payment_sessions s
		JOIN session_events e ON e.session_id = s.id ORDER BY s.id, e.id`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]string{}
	final := map[string]string{}
	for rows.Next() {
		var id, st, from, to string
		_ = rows.Scan(&id, &st, &from, &to)
		final[id] = st
		if prev, ok := last[id]; ok && prev != from {
			bad = append(bad, fmt.Sprintf("session %s timeline: %s then an event from %q to %s", id, prev, from, to))
		}
		if prev, ok := last[id]; ok && prev == to {
			bad = append(bad, fmt.Sprintf("session %s timeline: %s twice", id, to))
		}
		last[id] = to
	}
	rows.Close()
	for id, st := range final {
		if last[id] != st {
			bad = append(bad, fmt.Sprintf("session %s is %s, its timeline ends at %s", id, st, last[id]))
		}
	}
	if n := q(`SELECT count(*) FROM payment_sessions s WHERE NOT EXISTS (SELECT 1 FROM session_events e WHERE e.session_id = s.id)`); n != 0 {
		bad = append(bad, fmt.Sprintf("%d sessions without a timeline", n))
	}
	// Refund timelines.
	rows, err = b.pool.Query(ctx, `SELECT r.id::text, r.status, coalesce(e.from_status, ''), e.to_status FROM refunds r
		JOIN refund_events e ON e.refund_id = r.id ORDER BY r.id, e.id`)
	if err != nil {
		t.Fatal(err)
	}
	last, final = map[string]string{}, map[string]string{}
	for rows.Next() {
		var id, st, from, to string
		_ = rows.Scan(&id, &st, &from, &to)
		final[id] = st
		if prev, ok := last[id]; ok && (prev != from || prev == to) {
			bad = append(bad, fmt.Sprintf("refund %s timeline: %s then an event from %q to %s", id, prev, from, to))
		}
		last[id] = to
	}
	rows.Close()
	for id, st := range final {
		if last[id] != st {
			bad = append(bad, fmt.Sprintf("refund %s is %s, its timeline ends at %s", id, st, last[id]))
		}
	}
	// Open cases are not duplicated for the same money.
	if n := q(`SELECT count(*) FROM (SELECT split_part(f, ' (', 1), c.kind FROM finance_cases c, unnest(c.facts) f WHERE resolved_at IS NULL AND f NOT LIKE '%(missing)'
		GROUP BY split_part(f, ' (', 1), c.kind HAVING count(DISTINCT c.id) > 1) x`); n != 0 {
		bad = append(bad, fmt.Sprintf("%d gateway payments named by more than one open case", n))
	}
	if n := q(`SELECT count(*) FROM payment_sessions WHERE status IN ('Registering','Registered','Unknown','Authorized','Canceling') AND flagged_at IS NULL`); n != 0 {
		bad = append(bad, fmt.Sprintf("%d sessions active and unflagged at the end of the day", n))
		for _, r := range b.texts(t, `SELECT concat_ws(' ', id, order_id, status, gateway_payment_id, next_check_at, lease_owner, lease_until, check_attempts, created_at, updated_at) FROM payment_sessions WHERE status IN ('Registering','Registered','Unknown','Authorized','Canceling') AND flagged_at IS NULL`) {
			bad = append(bad, "  active: "+r)
			id, _, _ := strings.Cut(r, " ")
			for _, e := range b.texts(t, `SELECT concat_ws(' ', created_at, from_status, to_status, actor_kind, actor_id, reason) FROM session_events WHERE session_id = $1 ORDER BY id`, id) {
				bad = append(bad, "    event: "+e)
			}
			for _, e := range b.texts(t, `SELECT concat_ws(' ', kind, created_at, resolved_at, facts::text) FROM finance_cases WHERE session_id = $1 ORDER BY id`, id) {
				bad = append(bad, "    case: "+e)
			}
			for _, g := range (&chaosWorld{b: b}).gatewayIDsOf(id) {
				p, _ := b.gw.Payment(g)
				bad = append(bad, fmt.Sprintf("    gateway: %s %s", g, p.Status))
			}
		}
	}
	if n := q(`SELECT count(*) FROM refunds WHERE status = 'Pending' AND flagged_at IS NULL`); n != 0 {
		bad = append(bad, fmt.Sprintf("%d refunds Pending and unflagged at the end of the day", n))
	}
	_ = strings.Contains
	return bad
}

// endDay ends a day: the faults queued for calls that never came are spent (they would fail the
// catch-up's own calls), every gateway payment reaches a final state, and both replicas' patrols
// and the reconciliation catch up (30 rounds of 3 hours; endDayIn).
func (w *chaosWorld) endDay(ctx context.Context) { w.endDayIn(ctx, 30, false) }

// endDayIn is endDay in rounds of 3 hours. keepFailed leaves the refunds of a payment the
// gateway failed one of as they are (a day where the gateway fails refunds it had paid: its
// failed is final, and fakegw moves a payment's refunds all at once); otherwise every refund is
// paid.
func (w *chaosWorld) endDayIn(ctx context.Context, rounds int, keepFailed bool) {
	w.b.gw.SetLatency(0)
	for range 300 {
		_, _ = w.b.gw.Refund(ctx, "gp_drain", "drain", 1, "EUR")
		_, _ = w.b.gw.Status(ctx, "gp_drain")
		_, _ = w.b.gw.Reverse(ctx, "gp_drain", "drain")
	}
	w.b.gw.SetRefundOutcome("succeeded")
	for range rounds {
		failed := map[string]bool{}
		if keepFailed {
			failed = w.failedRefundPayments()
		}
		for i := 1; i < 2000; i++ {
			id := "gp_fake_" + strconv.Itoa(i)
			p, ok := w.b.gw.Payment(id)
			if !ok {
				continue
			}
			switch p.Status {
			case payments.GatewayPending:
				w.b.gw.SetStatus(id, payments.GatewayExpired)
			case payments.GatewayAuthorized:
				w.b.gw.SetStatus(id, payments.GatewaySucceeded)
			}
			if !failed[id] {
				w.b.gw.SetRefundStatus(id, "succeeded")
			}
		}
		w.b.clock.Advance(3 * time.Hour)
		var wg sync.WaitGroup
		for _, svc := range w.svcs() {
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = svc.SweepOnce(ctx); _, _ = svc.DriveRefunds(ctx) }()
		}
		wg.Wait()
	}
	for range 3 {
		_, _ = w.b.svc.ReconcileOnce(ctx)
		w.b.clock.Advance(time.Hour)
	}
}

// salt orders a step's pick of rows by the seed (ORDER BY md5(... || salt)) over columns a seed
// makes alike from run to run (order ids, amounts, the injected clock's times): ORDER BY random()
// ignored the seed, and a seed's day could not be replayed.
func (w *chaosWorld) salt() string { return strconv.Itoa(w.intn(1 << 30)) }

// chaosSeeds is a chaos day's seeds and steps: scale(3, 12) seeds from 1 and scale(300, 1000)
// steps, or from the environment — PREFIX_SEEDS=N (N seeds from wide), PREFIX_SEED=N (that one),
// PREFIX_STEPS=N.
func chaosSeeds(prefix string, wide uint64) (seeds []uint64, steps int) {
	for i := range scale(3, 12) {
		seeds = append(seeds, uint64(1+i))
	}
	if s := os.Getenv(prefix + "_SEEDS"); s != "" {
		n, _ := strconv.Atoi(s)
		seeds = nil
		for i := range n {
			seeds = append(seeds, wide+uint64(i))
		}
	}
	if s := os.Getenv(prefix + "_SEED"); s != "" {
		n, _ := strconv.ParseUint(s, 10, 64)
		seeds = []uint64{n}
	}
	steps = scale(300, 1000)
	if s := os.Getenv(prefix + "_STEPS"); s != "" {
		steps, _ = strconv.Atoi(s)
	}
	return seeds, steps
}
