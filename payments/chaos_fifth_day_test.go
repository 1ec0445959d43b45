package payments_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// chaos5 is the fifth chaos day (an outside review, chaos5): the first day's mess with the newer
// paths mixed in — refunds read back by reconciliation, hand settlements by four eyes with news
// between proposal and approval, cancels by code racing a check and a patrol, a replica dying
// mid-send — over a gateway behind a proxy that answers late, times out (408/502/504) and
// contradicts itself (captured, then failed; a refund paid, then failed). Its settleable and
// gwRefundsOf are the fourth day's.
type chaos5 struct {
	*chaos4
	proxy, dying *proxyGW
	c            *payments.Service // replica-c: its sends die on the wire (dying)
	violations   []string
}

var errReplicaDied = errors.New("chaos5: replica died mid-send")

var proxyStatuses = []int{408, 502, 504}

// proxyGW is fakegw behind a proxy: the next calls of an operation can be queued to time out at
// the proxy (408/502/504) while the gateway processes them now or later (at the next step), or,
// while die is set, every send makes the caller's process die once it is on the wire.
type proxyGW struct {
	*fakegw.Gateway
	mu       sync.Mutex
	modes    map[string][]int // op → the HTTP statuses of its next calls
	deferred []func()         // sends the gateway processes at the next step
	die      bool             // every send dies after it went on the wire …
	later    bool             // … and the gateway processes it later (else at once)
	reverses map[string]map[string]bool
}

func newProxyGW(g *fakegw.Gateway) *proxyGW {
	return &proxyGW{Gateway: g, modes: map[string][]int{}, reverses: map[string]map[string]bool{}}
}

func (g *proxyGW) queue(op string, status int) {
	g.mu.Lock()
	g.modes[op] = append(g.modes[op], status)
	g.mu.Unlock()
}

// calm ends the proxy's timeouts queued for calls that never came.
func (g *proxyGW) calm() {
	g.mu.Lock()
	g.modes = map[string][]int{}
	g.mu.Unlock()
}

// next is what becomes of op's next call: the proxy's status (0: the gateway answers), whether
// the caller dies, and whether the gateway processes the send later.
func (g *proxyGW) next(op string) (status int, die, later bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.die {
		return 0, true, g.later
	}
	if q := g.modes[op]; len(q) > 0 {
		g.modes[op] = q[1:]
		return q[0], false, len(q)%2 == 0
	}
	return 0, false, false
}

// flush lets the gateway process the sends it got late.
func (g *proxyGW) flush() {
	g.mu.Lock()
	d := g.deferred
	g.deferred = nil
	g.mu.Unlock()
	for _, f := range d {
		f()
	}
}

// send delivers a mutating call through the proxy: nil when the gateway answers the caller
// (who then makes the call), else do runs (now or at the next step) and the caller gets the
// proxy's timeout, or dies.
func (g *proxyGW) send(op string, do func()) error {
	st, die, later := g.next(op)
	if st == 0 && !die {
		return nil
	}
	if later {
		g.mu.Lock()
		g.deferred = append(g.deferred, do)
		g.mu.Unlock()
	} else {
		do()
	}
	if die {
		panic(errReplicaDied)
	}
	return &payments.GatewayError{Kind: payments.FailureUnknown, Op: op, HTTPStatus: st, Err: context.DeadlineExceeded}
}

func (g *proxyGW) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	if err := g.send(fakegw.OpRegister, func() { _, _ = g.Gateway.Register(context.Background(), req) }); err != nil {
		return payments.GatewayPayment{}, err
	}
	return g.Gateway.Register(ctx, req)
}

func (g *proxyGW) Reverse(ctx context.Context, id, key string) (payments.GatewayPayment, error) {
	g.mu.Lock()
	if g.reverses[id] == nil {
		g.reverses[id] = map[string]bool{}
	}
	g.reverses[id][key] = true
	g.mu.Unlock()
	if err := g.send(fakegw.OpReverse, func() { _, _ = g.Gateway.Reverse(context.Background(), id, key) }); err != nil {
		return payments.GatewayPayment{}, err
	}
	return g.Gateway.Reverse(ctx, id, key)
}

func (g *proxyGW) Refund(ctx context.Context, id, key string, amount int64, cur string) (payments.GatewayRefund, error) {
	if err := g.send(fakegw.OpRefund, func() { _, _ = g.Gateway.Refund(context.Background(), id, key, amount, cur) }); err != nil {
		return payments.GatewayRefund{}, err
	}
	return g.Gateway.Refund(ctx, id, key, amount, cur)
}

func (g *proxyGW) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	if st, _, _ := g.next(fakegw.OpStatus); st != 0 {
		return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureUnknown, Op: fakegw.OpStatus, HTTPStatus: st, Err: context.DeadlineExceeded}
	}
	return g.Gateway.Status(ctx, id)
}

func (g *proxyGW) RefundStatus(ctx context.Context, id string) (payments.GatewayRefund, error) {
	if st, _, _ := g.next(fakegw.OpRefundStatus); st != 0 {
		return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureUnknown, Op: fakegw.OpRefundStatus, HTTPStatus: st, Err: context.DeadlineExceeded}
	}
	return g.Gateway.RefundStatus(ctx, id)
}

// caseVersions are the session's open cases of the gateway's word, id → facts and detail.
func (w *chaos5) caseVersions(sid string) map[string]string {
	out := map[string]string{}
	for _, r := range w.b.texts(w.t, `SELECT id || E'\t' || facts::text || detail FROM finance_cases WHERE session_id = $1 AND resolved_at IS NULL
		AND kind IN ('gateway_mismatch', 'untrusted_confirmation_url')`, sid) {
		id, v, _ := strings.Cut(r, "\t")
		out[id] = v
	}
	return out
}

// onReplicaC runs f as replica-c, whose process dies when its send goes out (f's deferred
// rollbacks run as the panic unwinds, as a dying process's connections end).
func (w *chaos5) onReplicaC(f func()) (died bool) {
	done := make(chan bool)
	go func() {
		defer func() {
			r := recover()
			if r != nil && r != errReplicaDied { //nolint:errorlint // the sentinel itself, as panicked
				panic(r)
			}
			done <- r != nil
		}()
		f()
	}()
	return <-done
}

func (w *chaos5) fifthStep(ctx context.Context) {
	b := w.b
	w.proxy.flush()
	w.dying.flush()
	switch w.intn(20) {
	case 0, 1, 2, 3, 4, 5: // the first day's mess (creates, checks, cancels, refunds, patrols, settlements, clock)
		if w.b.clock.Now().Sub(w.start) > 5*24*time.Hour {
			return // the day's end stays within reconciliation's 7-day lookback
		}
		w.step(ctx)
	case 6: // the proxy times out the next call of an operation while the gateway goes on
		op := []string{fakegw.OpRegister, fakegw.OpRefund, fakegw.OpReverse, fakegw.OpStatus, fakegw.OpRefundStatus}[w.intn(5)]
		st := proxyStatuses[w.intn(3)]
		w.proxy.queue(op, st)
		w.logf("c5 next %s times out %d", op, st)
	case 7: // captured, then failed at the gateway (refunds of it or not)
		var id, gp string
		if b.pool.QueryRow(ctx, `SELECT id::text, gateway_payment_id FROM payment_sessions s WHERE status = 'Completed' AND gateway_payment_id IS NOT NULL
			ORDER BY md5(id::text || $1) LIMIT 1`, w.salt()).Scan(&id, &gp) != nil {
			return
		}
		if p, _ := b.gw.Payment(gp); p.Status != payments.GatewaySucceeded || w.intn(3) != 0 {
			return
		}
		b.gw.SetStatus(gp, payments.GatewayDeclined)
		w.logf("c5 gateway says %s (%s) failed after its capture", gp, id)
		if w.intn(2) == 0 {
			_, err := w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_c5_" + gp + "_declined", Type: "payment.updated", PaymentID: gp, Reference: id})
			w.logf("c5 webhook %s: %v", gp, err)
		}
	case 8: // a refund paid, then failed at the gateway
		var gp string
		if b.pool.QueryRow(ctx, `SELECT s.gateway_payment_id FROM refunds r JOIN payment_sessions s ON s.id = r.session_id
			WHERE r.status = 'Succeeded' AND s.gateway_payment_id IS NOT NULL ORDER BY md5(r.id::text || $1) LIMIT 1`, w.salt()).Scan(&gp) != nil {
			return
		}
		b.gw.SetRefundStatus(gp, "failed")
		w.logf("c5 gateway refunds of %s -> failed", gp)
	case 9, 10: // reconciliation reads back
		rep, err := w.pickSvc().ReconcileOnce(ctx)
		w.logf("c5 reconcile: %+v %v", rep, err)
	case 11, 12: // a hand settlement, with news between proposal and approval
		id, ok := w.settleable()
		if !ok {
			return
		}
		outcome := []payments.Status{payments.StatusCompleted, payments.StatusFailed}[w.intn(2)]
		seenAt := w.caseVersions(id)
		p, err := w.pickSvc().ProposeResolution(ctx, fin1, payments.ProposalInput{SessionID: id, Outcome: outcome, Reason: "gateway support", Evidence: "ticket C5"})
		w.logf("c5 propose %s %s: %v", id, outcome, err)
		if err != nil {
			return
		}
		switch w.intn(4) {
		case 0: // the gateway captures another amount, and a check or reconciliation learns it
			for _, gp := range w.gatewayIDsOf(id) {
				if pp, _ := b.gw.Payment(gp); pp.Status == payments.GatewayPending || pp.Status == payments.GatewayAuthorized {
					b.gw.SetAmount(gp, 100, "EUR")
					b.gw.SetStatus(gp, payments.GatewaySucceeded)
					w.logf("c5 gateway captures 1.00 on %s (%s)", gp, id)
				}
			}
			if w.intn(2) == 0 {
				_, err := w.pickSvc().Check(ctx, api, id)
				w.logf("c5 check between: %v", err)
			} else {
				_, err := w.pickSvc().ReconcileOnce(ctx)
				w.logf("c5 reconcile between: %v", err)
			}
		case 1: // a patrol of both replicas
			for _, svc := range w.svcs() {
				_, _ = svc.SweepOnce(ctx)
			}
		case 2: // a late webhook
			for _, gp := range w.gatewayIDsOf(id) {
				_, _ = w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_c5b_" + gp + strconv.Itoa(w.intn(1000)), Type: "payment.updated", PaymentID: gp, Reference: id})
			}
		}
		before := w.caseVersions(id)
		_, err = w.pickSvc().ApproveResolution(ctx, fin2, p.ID)
		w.logf("c5 approve %d: %v", p.ID, err)
		if err != nil {
			_, _ = w.pickSvc().RejectResolution(ctx, fin1, p.ID, "stale")
			return
		}
		for cid, v := range before {
			if seenAt[cid] != v {
				w.violations = append(w.violations, fmt.Sprintf("proposal %d (%s %s) approved over case %s opened or changed since the proposal: %s", p.ID, id, outcome, cid, v))
			}
		}
	case 13: // a stuck refund settled by hand (four eyes), reconciliation possibly reading back between
		var rid string
		if b.pool.QueryRow(ctx, `SELECT r.id::text FROM refunds r WHERE r.status = 'Pending' AND r.flagged_at IS NOT NULL
			AND NOT EXISTS (SELECT 1 FROM resolution_proposals p WHERE p.session_id = r.session_id AND p.state = 'proposed')
			ORDER BY md5(r.id::text || $1) LIMIT 1`, w.salt()).Scan(&rid) != nil {
			// None stuck yet: the gateway leaves the next refund pending, for the patrols and the
			// clock to flag (the first day's refunds are pending a quarter of the time only).
			var id string
			if b.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE status = 'Completed' ORDER BY md5(id::text || $1) LIMIT 1`, w.salt()).Scan(&id) != nil {
				return
			}
			b.gw.SetRefundOutcome("pending")
			r, err := w.pickSvc().CreateRefund(ctx, api, payments.RefundInput{PaymentID: id, Amount: 100})
			b.gw.SetRefundOutcome("succeeded")
			w.logf("c5 refund left pending %s: %s %s %v", id, r.Refund.ID, r.Refund.Status, err)
			return
		}
		outcome := []string{payments.RefundFailed, payments.RefundFailed, payments.RefundSucceeded}[w.intn(3)]
		p, err := w.pickSvc().ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: rid, Outcome: outcome, Reason: "gateway support", Evidence: "ticket C5R"})
		w.logf("c5 propose refund %s %s: %v", rid, outcome, err)
		if err != nil {
			return
		}
		if w.intn(2) == 0 {
			_, _ = w.pickSvc().ReconcileOnce(ctx)
		}
		_, err = w.pickSvc().ApproveResolution(ctx, fin2, p.ID)
		w.logf("c5 approve refund outcome %d: %v", p.ID, err)
		if err != nil {
			_, _ = w.pickSvc().RejectResolution(ctx, fin1, p.ID, "stale")
		}
	case 14, 15: // a cancel by code while a check and a patrol run (the capture maybe landing meanwhile)
		id, st, _, ok := w.randomSession()
		if !ok || (st != "Registered" && st != "Unknown" && st != "Authorized" && st != "Registering") {
			return
		}
		ch, err := w.pickSvc().RequestCancel(ctx, api, id)
		if err != nil {
			w.logf("c5 cancel request %s: %v", id, err)
			return
		}
		code := w.code(id)
		if w.intn(3) == 0 {
			w.proxy.queue(fakegw.OpReverse, proxyStatuses[w.intn(3)])
		}
		var wg sync.WaitGroup
		wg.Add(3)
		go func() {
			defer wg.Done()
			r, err := w.b.svc.ConfirmCancel(ctx, api, id, ch.ID, code)
			w.logf("c5 cancel confirm %s: %s %v", id, r.Session.Status, err)
		}()
		go func() { defer wg.Done(); _, _ = w.other.Check(ctx, api, id) }()
		go func() { defer wg.Done(); _, _ = w.other.SweepOnce(ctx) }()
		if w.intn(3) == 0 {
			for _, gp := range w.gatewayIDsOf(id) {
				if p, _ := b.gw.Payment(gp); p.Status == payments.GatewayPending || p.Status == payments.GatewayAuthorized {
					b.gw.SetStatus(gp, payments.GatewaySucceeded)
					w.logf("c5 captured %s (%s) during the cancel", gp, id)
				}
			}
		}
		wg.Wait()
	case 16, 17: // replica-c dies mid-send: a create, a cancel or a refund
		w.dying.mu.Lock()
		w.dying.die, w.dying.later = true, w.intn(2) == 0
		w.dying.mu.Unlock()
		defer func() {
			w.dying.mu.Lock()
			w.dying.die = false
			w.dying.mu.Unlock()
		}()
		switch w.intn(3) {
		case 0:
			w.mu.Lock()
			order := fmt.Sprintf("c5-%d", len(w.orders))
			w.orders = append(w.orders, order)
			w.mu.Unlock()
			died := w.onReplicaC(func() {
				_, _ = w.c.Create(ctx, api, payments.CreateInput{OrderID: order, Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
			})
			w.logf("c5 replica-c create %s: died %v", order, died)
		case 1:
			id, st, _, ok := w.randomSession()
			if !ok || (st != "Registered" && st != "Unknown" && st != "Authorized") {
				return
			}
			ch, err := w.b.svc.RequestCancel(ctx, api, id)
			if err != nil {
				return
			}
			code := w.code(id)
			died := w.onReplicaC(func() { _, _ = w.c.ConfirmCancel(ctx, api, id, ch.ID, code) })
			w.logf("c5 replica-c cancel %s: died %v", id, died)
		default:
			id, st, _, ok := w.randomSession()
			if !ok || st != "Completed" {
				return
			}
			amount := int64(100 * (1 + w.intn(4)))
			died := w.onReplicaC(func() {
				_, _ = w.c.CreateRefund(ctx, api, payments.RefundInput{PaymentID: id, Amount: amount, RequestKey: "c5-" + id})
			})
			w.logf("c5 replica-c refund %s %d: died %v", id, amount, died)
		}
	default: // the patrols
		var wg sync.WaitGroup
		for _, svc := range w.svcs() {
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = svc.SweepOnce(ctx); _, _ = svc.DriveRefunds(ctx) }()
		}
		wg.Wait()
		w.logf("c5 patrol")
	}
}

// TestAFifthDayKeepsTheMoneyInvariants runs seeded fifth days (chaos5) and checks the money:
// chaosInvariants less what settling by hand leaves by design (chaosInvariantsByHand), the staff
// invariants, PaymentReceived once exactly when Completed, one reverse operation and one reverse
// key per payment, no approval over a case opened or changed since its proposal, a refund
// Succeeded here that the gateway failed or lost named by a case, a refund settled Failed by
// hand that the gateway paid (or has not failed) named by an open case (paidRefundsBookedFailed:
// reconciliation reads those back, readBackFailedByHand), and every ledger entry beside its
// timeline event. Written by an outside review (chaos5: it found the refunds settled Failed by
// hand that the gateway paid later on no case, and fakegw answering a refund key repeated after
// the payment was declined 409 not_refundable instead of the earlier refund). make test runs
// 3 seeds of 150 steps; make polygon 12 seeds of 1,000 (PITLANE_SCALE=full). CHAOS5_SEED,
// CHAOS5_SEEDS (from 900), CHAOS5_STEPS and CHAOS5_LOG=1 widen it; a seed picks the same steps,
// not the same interleaving. Negative control: readBackFailedByHand returning at once (no
// read-back of refunds settled Failed by hand): CHAOS5_SEEDS=12 CHAOS5_STEPS=400 fails seeds 901
// and 904 ("gateway refund … is refund … booked Failed, on no open case"); before case 13 left
// refunds pending itself, 52 seeds passed without it.
func TestAFifthDayKeepsTheMoneyInvariants(t *testing.T) {
	t.Parallel()
	seeds, _ := chaosSeeds("CHAOS5", 900)
	steps := scale(150, 1000)
	if s := os.Getenv("CHAOS5_STEPS"); s != "" {
		steps, _ = strconv.Atoi(s)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runChaos5(t, seed, steps) })
	}
}

func runChaos5(t *testing.T, seed uint64, steps int) {
	ctx := context.Background()
	w := &chaos5{chaos4: &chaos4{chaosWorld: &chaosWorld{t: t, rng: rand.New(rand.NewPCG(seed, 55))}}}
	mod := func(c *payments.Config) {
		c.LeaseDuration, c.GatewayTimeout = 30*time.Second, 5*time.Second
		c.SweepConcurrency = 4
		c.Backoff = []time.Duration{time.Minute, 10 * time.Minute, time.Hour}
		c.RefundDirectLimit = map[string]int64{"EUR": 1_000_000}
	}
	gw := fakegw.New()
	w.proxy, w.dying = newProxyGW(gw), newProxyGW(gw)
	w.b = newBench(t, mod, func(c *payments.Config) { c.Gateway = w.proxy })
	w.b.gw = gw
	w.b.plain = w.b.service(w.b.pool, "setup", func(c *payments.Config) { c.Gateway = gw })
	w.other = w.b.service(testdb.Pool(t, w.b.url), "replica-b", mod, func(c *payments.Config) { c.Gateway = w.proxy })
	w.c = w.b.service(testdb.Pool(t, w.b.url), "replica-c", mod, func(c *payments.Config) { c.Gateway = w.dying })
	w.start = w.b.clock.Now()
	for range steps {
		w.fifthStep(ctx)
	}
	// The day's end: the late sends land, nothing times out any more, and the day ends within
	// reconciliation's lookback (10 rounds of 3 hours) with a refund's failed final.
	w.proxy.flush()
	w.dying.flush()
	w.proxy.calm()
	w.endDayIn(ctx, 10, true)

	bad := append([]string{}, w.violations...)
	bad = append(bad, chaosInvariantsByHand(t, w.b)...)
	bad = append(bad, staffInvariants(t, w.b)...)
	bad = append(bad, receivedOnceWhenCompleted(t, w.b)...)
	bad = append(bad, w.b.texts(t, `SELECT 'session ' || session_id || ' has ' || count(*) || ' reverse operations' FROM reverse_operations GROUP BY session_id HAVING count(*) > 1`)...)
	keys := map[string]map[string]bool{}
	for _, g := range []*proxyGW{w.proxy, w.dying} {
		g.mu.Lock()
		for gp, ks := range g.reverses {
			if keys[gp] == nil {
				keys[gp] = map[string]bool{}
			}
			for k := range ks {
				keys[gp][k] = true
			}
		}
		g.mu.Unlock()
	}
	for gp, ks := range keys {
		if len(ks) > 1 {
			bad = append(bad, fmt.Sprintf("gateway payment %s reversed with %d keys", gp, len(ks)))
		}
	}
	// A refund Succeeded here that the gateway failed (or lost) is named by a case: open, or
	// resolved by a person (not a hand settlement's).
	for _, row := range w.b.texts(t, `SELECT r.id::text || ' ' || coalesce(r.gateway_refund_id, '-') || ' ' || coalesce(s.gateway_payment_id, '-') || ' ' || s.id FROM refunds r JOIN payment_sessions s ON s.id = r.session_id WHERE r.status = 'Succeeded'`) {
		f := strings.Fields(row)
		var gr payments.GatewayRefund
		var err error
		found := true
		if f[1] != "-" {
			if gr, err = gw.RefundStatus(ctx, f[1]); err != nil {
				found, err = false, nil
			}
		} else if f[2] != "-" {
			gr, found, err = gw.FindRefund(ctx, f[2], f[0])
		}
		if err != nil || (found && gr.Status != "failed") {
			continue
		}
		if w.b.count(t, `SELECT count(*) FROM finance_cases c WHERE c.session_id = $1 AND (c.resolved_at IS NULL OR (c.resolved_by <> '' AND c.resolution NOT LIKE 'settled as%'))
			AND EXISTS (SELECT 1 FROM unnest(c.facts) f WHERE f LIKE 'refund ' || $2 || ' %')`, f[3], f[0]) == 0 {
			bad = append(bad, fmt.Sprintf("refund %s Succeeded here, the gateway says %s (found %v), on no case", f[0], gr.Status, found))
			for _, e := range w.b.texts(t, `SELECT concat_ws(' | ', c.id, kind, c.created_at, resolved_at, resolved_by, resolution, facts::text) FROM finance_cases c WHERE c.session_id = $1 ORDER BY c.id`, f[3]) {
				bad = append(bad, "    case: "+e)
			}
			for _, e := range w.b.texts(t, `SELECT concat_ws(' | ', r.status, r.updated_at, r.detail, s.status, s.updated_at) FROM refunds r JOIN payment_sessions s ON s.id = r.session_id WHERE r.id = $1`, f[0]) {
				bad = append(bad, "    refund: "+e)
			}
		}
	}
	// A refund settled Failed by hand that the gateway paid is named by an open case.
	bad = append(bad, paidRefundsBookedFailed(t, w.b)...)
	// Every ledger entry has its timeline event.
	bad = append(bad, w.b.texts(t, `SELECT 'PaymentReceived of ' || a.session_id || ' without a Completed event' FROM accounting_entries a WHERE a.entry_type = 'PaymentReceived'
		AND NOT EXISTS (SELECT 1 FROM session_events e WHERE e.session_id = a.session_id AND e.to_status = 'Completed')`)...)
	bad = append(bad, w.b.texts(t, `SELECT 'RefundIssued of ' || a.refund_id || ' without a Succeeded event' FROM accounting_entries a WHERE a.entry_type = 'RefundIssued'
		AND NOT EXISTS (SELECT 1 FROM refund_events e WHERE e.refund_id = a.refund_id AND e.to_status = 'Succeeded')`)...)
	if len(bad) > 0 || os.Getenv("CHAOS5_LOG") != "" {
		for _, l := range w.log {
			t.Log(l)
		}
		for _, s := range bad {
			t.Errorf("seed %d: %s", seed, s)
		}
	}
	t.Logf("seed %d: sessions %v; cases %v; refunds %v; proposals %v; register calls %d, reverse calls %d", seed,
		w.b.texts(t, `SELECT status || ':' || count(*) FROM payment_sessions GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || count(*) || '/' || count(resolved_at) FROM finance_cases GROUP BY kind ORDER BY 1`),
		w.b.texts(t, `SELECT status || ':' || count(*) FROM refunds GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || state || ':' || count(*) FROM resolution_proposals GROUP BY kind, state ORDER BY 1`),
		gw.Calls(fakegw.OpRegister), gw.Calls(fakegw.OpReverse))
}
