package payments_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// chaos4: people settling by hand while the gateway contradicts them later (an outside review,
// chaos4). Sessions flagged (mismatched amounts, lost answers, schedules run out), settled
// Completed / Failed by four eyes; refunds stuck Pending, settled Failed / Succeeded by hand,
// corrected Failed → Succeeded once the gateway paid; Pay clicks on orders in review; webhooks,
// checks and reconciliation finding the gateway's truth later; clock jumps.
// CHAOS4_SEED, CHAOS4_SEEDS (from 700), CHAOS4_STEPS (default 250), CHAOS4_LOG=1.
type chaos4 struct {
	*chaosWorld
	payViolations []string
}

func (w *chaos4) orderOf(sessionID string) string {
	var o string
	_ = w.b.pool.QueryRow(context.Background(), `SELECT order_id FROM payment_sessions WHERE id = $1`, sessionID).Scan(&o)
	return o
}

// heldFor lists the gateway payments of an order's sessions that hold money while their
// session is not Completed with them as its own payment.
func (w *chaos4) heldFor(order string) []string {
	var out []string
	for _, sid := range w.b.texts(w.t, `SELECT id::text FROM payment_sessions WHERE order_id = $1`, order) {
		for _, gp := range w.gatewayIDsOf(sid) {
			p, _ := w.b.gw.Payment(gp)
			if p.Status != payments.GatewaySucceeded && p.Status != payments.GatewayAuthorized {
				continue
			}
			var st, own string
			_ = w.b.pool.QueryRow(context.Background(), `SELECT status, coalesce(gateway_payment_id, '') FROM payment_sessions WHERE id = $1`, sid).Scan(&st, &own)
			if st == "Completed" && own == gp {
				continue
			}
			if st == "Failed" || st == "Canceled" {
				out = append(out, fmt.Sprintf("%s of %s (%s, gateway %s %d)", gp, sid, st, p.Status, p.Amount))
			}
		}
	}
	return out
}

func (w *chaos4) pay(ctx context.Context, order string) {
	held := w.heldFor(order)
	before := w.b.gw.Calls(fakegw.OpRegister)
	inReview, _ := w.b.svc.PaymentInReview(ctx, order)
	_, err := w.pickSvc().CheckoutPay(ctx, uuid.NewString(), payments.CreateInput{OrderID: order, Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"}, 0)
	after := w.b.gw.Calls(fakegw.OpRegister)
	w.logf("c4 pay click %s: in review %v, held %v, registrations +%d: %v", order, inReview, held, after-before, err)
	// Only money pitlane was told about: a case (open or resolved) whose facts name the payment
	// holding money. (Money captured after the settlement that nobody asked about yet is
	// reconciliation's to find.)
	var known []string
	for _, h := range held {
		gp := strings.Fields(h)[0]
		if w.b.count(w.t, `SELECT count(*) FROM finance_cases c JOIN payment_sessions s ON s.id = c.session_id WHERE s.order_id = $1
			AND EXISTS (SELECT 1 FROM unnest(c.facts) f WHERE f LIKE $2 || ' (succeeded,%' OR f LIKE $2 || ' (authorized,%')`, order, gp) > 0 ||
			// or pitlane itself applied the gateway's authorization to the session
			w.b.count(w.t, `SELECT count(*) FROM payment_sessions s JOIN session_events e ON e.session_id = s.id AND e.to_status = 'Authorized'
				WHERE s.order_id = $1 AND s.gateway_payment_id = $2`, order, gp) > 0 {
			known = append(known, h)
		}
	}
	held = known
	if len(held) > 0 && after > before {
		cases := w.b.texts(w.t, `SELECT concat_ws(' | ', c.id, c.kind, c.session_id, c.resolved_at, c.resolution, c.facts::text) FROM finance_cases c JOIN payment_sessions s ON s.id = c.session_id WHERE s.order_id = $1 ORDER BY c.id`, order)
		w.payViolations = append(w.payViolations, fmt.Sprintf("Pay click on %s registered a payment while the gateway holds %v; cases: %v", order, held, cases))
	}
}

func (w *chaos4) settleable() (string, bool) {
	var id string
	err := w.b.pool.QueryRow(context.Background(), `SELECT s.id::text FROM payment_sessions s WHERE s.status IN ('Registering','Registered','Unknown','Authorized','Canceling')
		AND (s.flagged_at IS NOT NULL OR s.status = 'Unknown' OR EXISTS (SELECT 1 FROM finance_cases c WHERE c.session_id = s.id AND c.kind = 'gateway_mismatch' AND c.resolved_at IS NULL))
		AND NOT EXISTS (SELECT 1 FROM resolution_proposals p WHERE p.session_id = s.id AND p.state = 'proposed')
		ORDER BY md5(s.order_id || s.created_at::text || $1), s.created_at LIMIT 1`, w.salt()).Scan(&id)
	return id, err == nil
}

func (w *chaos4) fourthStep(ctx context.Context) {
	b := w.b
	switch a := w.intn(17); a {
	case 0, 1: // a new order, or a Pay click on an old one
		w.mu.Lock()
		var order string
		if len(w.orders) == 0 || w.rng.IntN(2) == 0 {
			order = fmt.Sprintf("c4-%d", len(w.orders))
			w.orders = append(w.orders, order)
		} else {
			order = w.orders[w.rng.IntN(len(w.orders))]
		}
		w.mu.Unlock()
		if f := w.intn(5); f < 2 {
			b.gw.Fail(fakegw.OpRegister, chaosFaults[f], 1) // a lost answer, a 5xx
		}
		if w.intn(2) == 0 {
			w.pay(ctx, order)
		} else {
			r, err := w.pickSvc().Create(ctx, api, payments.CreateInput{OrderID: order, Amount: 1000, Currency: "EUR", CustomerContact: "c@example.com"})
			w.logf("c4 create %s: %s %s %v", order, r.Session.ID, r.Session.Status, err)
		}
	case 2, 3: // the customer at the gateway, sometimes for another amount
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
		p, _ := b.gw.Payment(gp)
		if w.intn(4) == 0 {
			b.gw.SetAmount(gp, []int64{100, 999}[w.intn(2)], "EUR")
			w.logf("c4 gateway misstates %s (%s)", gp, id)
		}
		var to payments.GatewayStatus
		switch p.Status {
		case payments.GatewayPending:
			to = []payments.GatewayStatus{payments.GatewayAuthorized, payments.GatewaySucceeded, payments.GatewaySucceeded, payments.GatewayDeclined, payments.GatewayExpired}[w.intn(5)]
		case payments.GatewayAuthorized:
			to = payments.GatewaySucceeded
		default:
			return
		}
		b.gw.SetStatus(gp, to)
		w.logf("c4 gateway %s (%s) %s -> %s", gp, id, p.Status, to)
		if w.intn(3) == 0 {
			_, err := w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_" + gp + "_" + string(to), Type: "payment.updated", PaymentID: gp, Reference: id})
			w.logf("c4 webhook %s: %v", gp, err)
		}
	case 4: // the patrols (status looks sometimes failing), the refund drives
		if w.intn(3) == 0 {
			b.gw.Fail(fakegw.OpStatus, chaosFaults[w.intn(2)], 1+w.intn(3))
		}
		for _, svc := range w.svcs() {
			_, _ = svc.SweepOnce(ctx)
			_, _ = svc.DriveRefunds(ctx)
		}
		for range 3 {
			_, _ = b.gw.Status(ctx, "gp_drain")
		}
		w.logf("c4 patrol")
	case 5: // clock
		d := []time.Duration{2 * time.Second, 31 * time.Second, 11 * time.Minute, 2 * time.Hour}[w.intn(4)]
		b.clock.Advance(d)
		w.logf("c4 clock +%s", d)
	case 6: // finance settles a session by four eyes
		id, ok := w.settleable()
		if !ok {
			return
		}
		outcome := []payments.Status{payments.StatusCompleted, payments.StatusFailed, payments.StatusFailed}[w.intn(3)]
		if w.intn(3) == 0 { // finance closes the case it read first ("asked the gateway's support")
			var cid int64
			if b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE session_id = $1 AND kind = 'gateway_mismatch' AND resolved_at IS NULL`, id).Scan(&cid) == nil {
				_, err := w.pickSvc().ResolveCase(ctx, fin1, cid, "asked the gateway's support, ticket GW-4", "")
				w.logf("c4 resolve mismatch case %d of %s before settling: %v", cid, id, err)
			}
		}
		p, err := w.pickSvc().ProposeResolution(ctx, fin1, payments.ProposalInput{SessionID: id, Outcome: outcome, Reason: "gateway support says so", Evidence: "ticket FIN-4"})
		w.logf("c4 propose %s %s: %v", id, outcome, err)
		if err != nil {
			return
		}
		if w.intn(3) == 0 { // the gateway's truth arrives between
			_, err := w.pickSvc().Check(ctx, api, id)
			w.logf("c4 check between %s: %v", id, err)
		}
		_, err = w.pickSvc().ApproveResolution(ctx, fin2, p.ID)
		w.logf("c4 approve %d (%s %s): %v", p.ID, id, outcome, err)
		if err != nil {
			_, _ = w.pickSvc().RejectResolution(ctx, fin1, p.ID, "stale")
		} else if w.intn(2) == 0 { // the customer tries again at once
			w.pay(ctx, w.orderOf(id))
		}
	case 7, 8: // the shop refunds (pending at the gateway often), by key with a retry, or keyless twice
		var id string
		if b.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE status = 'Completed' ORDER BY md5(order_id || created_at::text || $1), created_at LIMIT 1`, w.salt()).Scan(&id) != nil {
			return
		}
		if w.intn(2) == 0 {
			b.gw.SetRefundOutcome("pending")
		} else {
			b.gw.SetRefundOutcome("succeeded")
		}
		if f := w.intn(5); f < 2 {
			b.gw.Fail(fakegw.OpRefund, chaosFaults[f], 1)
		}
		amount := int64(100 * (1 + w.intn(5)))
		key := ""
		if w.intn(2) == 0 {
			key = "c4-" + id + "-" + strconv.Itoa(w.intn(3))
		}
		r, err := w.pickSvc().CreateRefund(ctx, api, payments.RefundInput{PaymentID: id, Amount: amount, RequestKey: key})
		w.logf("c4 api refund %s %d key %q: %s %s %v", id, amount, key, r.Refund.ID, r.Refund.Status, err)
		if key != "" && w.intn(2) == 0 {
			r, err = w.pickSvc().CreateRefund(ctx, api, payments.RefundInput{PaymentID: id, Amount: amount, RequestKey: key})
			w.logf("c4 api refund retry %s: %s %s %v", id, r.Refund.ID, r.Refund.Status, err)
		}
		b.gw.SetRefundOutcome("succeeded")
		_, _ = b.gw.Refund(ctx, "gp_drain", "drain", 1, "EUR") // a fault no call took is spent
	case 9: // a stuck refund settled by hand, Failed or Succeeded
		var rid string
		if b.pool.QueryRow(ctx, `SELECT r.id::text FROM refunds r WHERE r.status = 'Pending' AND r.flagged_at IS NOT NULL
			AND NOT EXISTS (SELECT 1 FROM resolution_proposals p WHERE p.session_id = r.session_id AND p.state = 'proposed')
			ORDER BY md5(r.order_id || r.created_at::text || r.amount || $1), r.created_at LIMIT 1`, w.salt()).Scan(&rid) != nil {
			return
		}
		outcome := []string{payments.RefundFailed, payments.RefundFailed, payments.RefundSucceeded}[w.intn(3)]
		p, err := w.pickSvc().ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: rid, Outcome: outcome, Reason: "gateway support", Evidence: "ticket GW-4"})
		w.logf("c4 propose refund %s %s: %v", rid, outcome, err)
		if err != nil {
			return
		}
		if w.intn(3) == 0 {
			for _, svc := range w.svcs() {
				_, _ = svc.DriveRefunds(ctx)
			}
		}
		_, err = w.pickSvc().ApproveResolution(ctx, fin2, p.ID)
		w.logf("c4 approve refund outcome %d: %v", p.ID, err)
		if err != nil {
			_, _ = w.pickSvc().RejectResolution(ctx, fin1, p.ID, "stale")
		}
	case 10: // the gateway settles its refunds of a payment, days late (usually paid)
		var gp string
		if b.pool.QueryRow(ctx, `SELECT s.gateway_payment_id FROM refunds r JOIN payment_sessions s ON s.id = r.session_id WHERE s.gateway_payment_id IS NOT NULL
			AND (r.status = 'Pending' OR r.detail LIKE 'settled by hand:%') ORDER BY md5(r.order_id || r.created_at::text || r.amount || $1), r.created_at LIMIT 1`, w.salt()).Scan(&gp) != nil {
			return
		}
		st := []string{"succeeded", "succeeded", "failed"}[w.intn(3)]
		// A refund's failed is final, and succeeded is not taken back: fakegw moves all of a
		// payment's refunds at once, so only when that moves pending ones alone.
		for _, have := range w.gwRefundsOf(gp) {
			if have == "failed" || st == "failed" && have != "pending" {
				return
			}
		}
		b.gw.SetRefundStatus(gp, st)
		w.logf("c4 gateway refunds of %s -> %s", gp, st)
	case 11: // the correction of a refund settled Failed by hand, maybe with a shop refund between
		var rid, sid string
		if b.pool.QueryRow(ctx, `SELECT r.id::text, r.session_id::text FROM refunds r WHERE r.status = 'Failed' AND r.detail LIKE 'settled by hand:%'
			AND NOT EXISTS (SELECT 1 FROM resolution_proposals p WHERE p.session_id = r.session_id AND p.state = 'proposed')
			ORDER BY md5(r.order_id || r.created_at::text || r.amount || $1), r.created_at LIMIT 1`, w.salt()).Scan(&rid, &sid) != nil {
			return
		}
		p, err := w.pickSvc().ProposeRefundOutcome(ctx, fin1, payments.RefundOutcomeInput{RefundID: rid, Outcome: payments.RefundSucceeded, Reason: "the gateway paid it", Evidence: "dashboard"})
		w.logf("c4 propose correction %s: %v", rid, err)
		if err != nil {
			return
		}
		if w.intn(2) == 0 {
			r, err := w.pickSvc().CreateRefund(ctx, api, payments.RefundInput{PaymentID: sid, Amount: 100 * int64(1+w.intn(5))})
			w.logf("c4 api refund during correction %s: %s %s %v", sid, r.Refund.ID, r.Refund.Status, err)
		}
		_, err = w.pickSvc().ApproveResolution(ctx, fin2, p.ID)
		w.logf("c4 approve correction %d (%s): %v", p.ID, rid, err)
		if err != nil {
			_, _ = w.pickSvc().RejectResolution(ctx, fin1, p.ID, "stale")
		}
	case 12: // a check, a page look or a webhook for anything
		id, _, _, ok := w.randomSession()
		if !ok {
			return
		}
		switch w.intn(3) {
		case 0:
			s, err := w.pickSvc().Check(ctx, api, id)
			w.logf("c4 check %s: %s %v", id, s.Status, err)
		case 1:
			_, err := w.pickSvc().CheckNow(ctx, fin1, []string{id})
			w.logf("c4 check now %s: %v", id, err)
		default:
			for _, gp := range w.gatewayIDsOf(id) {
				_, err := w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: fmt.Sprintf("evt_l_%s_%d", gp, w.intn(1000)), Type: "payment.updated", PaymentID: gp, Reference: id})
				w.logf("c4 late webhook %s: %v", gp, err)
			}
		}
	case 13: // reconciliation
		rep, err := w.pickSvc().ReconcileOnce(ctx)
		w.logf("c4 reconcile: checked %d %v", rep.Checked, err)
	case 14, 16: // a Pay click on an order in review (or any old one)
		var order string
		if w.intn(2) == 0 {
			w.mu.Lock()
			orders := append([]string{}, w.orders...)
			w.mu.Unlock()
			for _, o := range orders {
				if len(w.heldFor(o)) > 0 {
					order = o
					break
				}
			}
		}
		if order != "" {
			w.pay(ctx, order)
			return
		}
		if b.pool.QueryRow(ctx, `SELECT s.order_id FROM finance_cases c JOIN payment_sessions s ON s.id = c.session_id ORDER BY c.resolved_at IS NULL DESC, md5(c.id::text || $1) LIMIT 1`, w.salt()).Scan(&order) != nil {
			return
		}
		w.pay(ctx, order)
	default: // finance resolves a case now and then (the gateway's money dealt with elsewhere)
		if w.intn(2) != 0 {
			return
		}
		var id int64
		if b.pool.QueryRow(ctx, `SELECT id FROM finance_cases WHERE resolved_at IS NULL AND kind NOT IN ('late_payment', 'duplicate_gateway_payment') ORDER BY md5(id::text || $1) LIMIT 1`, w.salt()).Scan(&id) != nil {
			return
		}
		_, err := w.pickSvc().ResolveCase(ctx, fin1, id, "handled", "")
		w.logf("c4 resolve case %d: %v", id, err)
	}
}

// TestAFourthDaySettledByHandKeepsTheMoneyInvariants (an outside review, chaos4: it found a
// session settled Failed beside money pitlane knew the gateway held — a mismatch case finance
// had resolved, an authorization — leaving review, and a Pay click charging again; seeds 701,
// 703, 704, 707, 708 before the fix, 40 seeds of 400 steps clean after it).
func TestAFourthDaySettledByHandKeepsTheMoneyInvariants(t *testing.T) {
	t.Parallel()
	seeds, _ := chaosSeeds("CHAOS4", 700)
	steps := 250
	if s := os.Getenv("CHAOS4_STEPS"); s != "" {
		fmt.Sscan(s, &steps)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runChaos4(t, seed, steps) })
	}
}

func runChaos4(t *testing.T, seed uint64, steps int) {
	ctx := context.Background()
	w := &chaos4{chaosWorld: &chaosWorld{t: t, rng: rand.New(rand.NewPCG(seed, 44))}}
	mod := func(c *payments.Config) {
		c.LeaseDuration, c.GatewayTimeout = 30*time.Second, 5*time.Second
		c.Backoff = []time.Duration{time.Second, time.Second, time.Second}
		c.RefundDirectLimit = map[string]int64{"EUR": 1_000_000}
	}
	w.b = newBench(t, mod)
	w.other = w.b.service(testdb.Pool(t, w.b.url), "replica-b", mod)
	w.start = w.b.clock.Now()
	for range steps {
		w.fourthStep(ctx)
	}
	// The day's end, the gateway's refunds as they are: payments reach an end, patrols and
	// reconciliation catch up.
	w.b.gw.SetRefundOutcome("succeeded")
	for range 6 {
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
		}
		w.b.clock.Advance(3 * time.Hour)
		for _, svc := range w.svcs() {
			_, _ = svc.SweepOnce(ctx)
			_, _ = svc.DriveRefunds(ctx)
		}
	}
	for range 2 {
		_, _ = w.b.svc.ReconcileOnce(ctx)
		w.b.clock.Advance(time.Hour)
	}
	// "The next refund asks first": one more 1-cent refund of each Completed payment with a
	// refund settled Failed by hand, so the gateway's paid ones reach a case.
	for _, sid := range w.b.texts(t, `SELECT DISTINCT session_id::text FROM refunds WHERE status = 'Failed' AND detail LIKE 'settled by hand:%'`) {
		r, err := w.b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: sid, Amount: 1})
		w.logf("c4 end: the next refund of %s: %s %v", sid, r.Refund.Status, err)
	}
	var bad []string
	bad = append(bad, w.payViolations...)
	// A session's gateway payment carries its reference.
	for _, r := range w.b.texts(t, `SELECT id::text || ' ' || gateway_payment_id FROM payment_sessions WHERE gateway_payment_id IS NOT NULL`) {
		f := strings.Fields(r)
		if p, ok := w.b.gw.Payment(f[1]); ok && p.Reference != f[0] {
			bad = append(bad, fmt.Sprintf("session %s is attached to gateway payment %s of reference %s", f[0], f[1], p.Reference))
		}
	}
	bad = append(bad, chaosInvariantsByHand(t, w.b)...)
	for _, m := range staffInvariants(t, w.b) {
		var pid int64
		if _, err := fmt.Sscanf(m, "approved refund outcome without its one settlement: %d", &pid); err == nil &&
			w.b.count(t, `SELECT count(*) FROM resolution_proposals p JOIN resolution_proposals q ON q.refund_id = p.refund_id AND q.id > p.id AND q.state = 'approved' AND q.refund_from = 'Failed'
				WHERE p.id = $1 AND p.refund_outcome = 'Failed'`, pid) == 1 {
			continue // corrected to Succeeded later
		}
		bad = append(bad, m)
	}
	bad = append(bad, receivedOnceWhenCompleted(t, w.b)...)
	// RefundIssued: each names a distinct refund, their sum within the amount.
	bad = append(bad, w.b.texts(t, `SELECT 'refund ' || refund_id || ' has ' || count(*) || ' RefundIssued' FROM accounting_entries WHERE entry_type = 'RefundIssued' GROUP BY refund_id HAVING count(*) > 1 OR refund_id IS NULL`)...)
	bad = append(bad, paidRefundsBookedFailed(t, w.b)...)
	// Two payments of one order holding money: every one but the order's Completed one on an open case.
	for _, order := range w.orders {
		for _, h := range w.heldFor(order) {
			gp := strings.Fields(h)[0]
			if w.b.count(t, `SELECT count(*) FROM finance_cases c JOIN payment_sessions s ON s.id = c.session_id WHERE s.order_id = $1 AND c.resolved_at IS NULL
				AND EXISTS (SELECT 1 FROM unnest(c.facts) f WHERE f LIKE $2 || ' (%')`, order, gp) == 0 {
				bad = append(bad, fmt.Sprintf("order %s: the gateway holds %s, on no open case", order, h))
			}
		}
	}
	if len(bad) > 0 || os.Getenv("CHAOS4_LOG") != "" {
		for _, l := range w.log {
			t.Log(l)
		}
		for _, s := range bad {
			t.Errorf("seed %d: %s", seed, s)
		}
		for _, r := range w.b.texts(t, `SELECT concat_ws(' | ', id, order_id, status, amount, gateway_payment_id, flagged_at, created_at,
			(SELECT string_agg(e.created_at || ' ' || coalesce(e.from_status, '') || '>' || e.to_status || ' ' || e.actor_kind, '; ' ORDER BY e.id) FROM session_events e WHERE e.session_id = s.id)) FROM payment_sessions s ORDER BY order_id, created_at`) {
			t.Log("session row: " + r)
		}
		for i := 1; i < 200; i++ {
			if p, ok := w.b.gw.Payment("gp_fake_" + strconv.Itoa(i)); ok {
				t.Logf("gateway payment: %s ref %s %s %d", p.ID, p.Reference, p.Status, p.Amount)
			}
		}
		for _, r := range w.b.texts(t, `SELECT concat_ws(' | ', r.id, r.session_id, r.status, r.amount, r.gateway_refund_id, r.flagged_at, r.check_attempts, r.detail,
			(SELECT string_agg(e.created_at || ' ' || coalesce(e.from_status, '') || '>' || e.to_status || ' ' || e.actor_kind, '; ' ORDER BY e.id) FROM refund_events e WHERE e.refund_id = r.id)) FROM refunds r ORDER BY r.created_at`) {
			t.Log("refund row: " + r)
		}
		for _, r := range w.b.texts(t, `SELECT concat_ws(' | ', created_at, session_id, operation, idempotency_key, outcome, detail) FROM gateway_calls WHERE operation LIKE '%refund%' ORDER BY id`) {
			t.Log("call: " + r)
		}
	}
	t.Logf("seed %d: sessions %v; cases %v; refunds %v; proposals %v", seed,
		w.b.texts(t, `SELECT status || ':' || count(*) FROM payment_sessions GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || count(*) || '/' || count(resolved_at) FROM finance_cases GROUP BY kind ORDER BY 1`),
		w.b.texts(t, `SELECT status || ':' || count(*) FROM refunds GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || coalesce(refund_outcome::text, outcome::text, '') || ':' || state || ':' || count(*) FROM resolution_proposals GROUP BY kind, refund_outcome, outcome, state ORDER BY 1`))
}

var _ = errors.Is

// chaosInvariantsByHand is chaosInvariants less what people settling by hand leave behind by
// design: knownByHand's findings; a gateway refund paid after its refund was settled Failed by
// hand, with the gateway's id or without it (found by our key: chaos5, seed 907), which
// paidRefundsBookedFailed judges (an open case naming it, or corrected); a session settled
// Completed by hand before its gateway id was known (the ledger has it under the session, the
// id is looked up by the next refund: withRecheckedRefunds).
func chaosInvariantsByHand(t *testing.T, b *bench) []string {
	ctx := context.Background()
	failedByHandFoundByKey := func(rid string) bool {
		r, err := b.gw.RefundStatus(ctx, rid)
		if err != nil {
			return false
		}
		for _, id := range b.texts(t, `SELECT r.id::text FROM refunds r JOIN payment_sessions s ON s.id = r.session_id WHERE s.gateway_payment_id = $1
			AND r.gateway_refund_id IS NULL AND r.status = 'Failed' AND r.detail LIKE 'settled by hand:%'`, r.PaymentID) {
			if g, found, _ := b.gw.FindRefund(ctx, r.PaymentID, id); found && g.ID == rid {
				return true
			}
		}
		return false
	}
	var bad []string
	skipping := false
	for _, m := range chaosInvariants(t, b) {
		if strings.HasPrefix(m, "    ") && skipping {
			continue
		}
		skipping = false
		if knownByHand(t, b, m) != "" {
			continue
		}
		var grid string
		if _, err := fmt.Sscanf(m, "gateway refund %s", &grid); err == nil && strings.Contains(m, "has 0 refund rows") && failedByHandFoundByKey(grid) {
			continue
		}
		if _, err := fmt.Sscanf(m, "gateway refund %s succeeded, 0 RefundIssued entries", &grid); err == nil && !strings.HasPrefix(m, " ") &&
			b.count(t, `SELECT count(*) FROM refunds WHERE gateway_refund_id = $1 AND status = 'Failed' AND detail LIKE 'settled by hand:%'`, grid) == 1 {
			skipping = true
			continue
		}
		if strings.Contains(m, ` Completed, own "") neither in the ledger`) {
			sid := strings.Fields(m[strings.Index(m, "(session ")+len("(session "):])[0]
			if b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1 AND entry_type = 'PaymentReceived'`, sid) == 1 &&
				b.gw.PaymentsWithReference(sid) == 1 {
				continue
			}
		}
		bad = append(bad, m)
	}
	return bad
}

// receivedOnceWhenCompleted: per payment, PaymentReceived at most once, and once exactly when
// Completed.
func receivedOnceWhenCompleted(t *testing.T, b *bench) []string {
	return b.texts(t, `SELECT 'session ' || s.id || ' ' || s.status || ' has ' || count(a.id) || ' PaymentReceived' FROM payment_sessions s
		LEFT JOIN accounting_entries a ON a.session_id = s.id AND a.entry_type = 'PaymentReceived' GROUP BY s.id, s.status
		HAVING count(a.id) > 1 OR (count(a.id) = 1) <> (s.status = 'Completed')`)
}

// paidRefundsBookedFailed: money the gateway refunded (or has not failed) that pitlane books as
// Failed is named by an open case (a correction to Succeeded takes it out of Failed).
func paidRefundsBookedFailed(t *testing.T, b *bench) []string {
	ctx := context.Background()
	var bad []string
	for _, row := range b.texts(t, `SELECT r.id::text || ' ' || coalesce(r.gateway_refund_id, '-') || ' ' || coalesce(s.gateway_payment_id, '-') FROM refunds r JOIN payment_sessions s ON s.id = r.session_id WHERE r.status = 'Failed'`) {
		f := strings.Fields(row)
		var gr payments.GatewayRefund
		var err error
		found := true
		if f[1] != "-" {
			gr, err = b.gw.RefundStatus(ctx, f[1])
		} else {
			gr, found, err = b.gw.FindRefund(ctx, f[2], f[0])
		}
		if err != nil || !found || gr.Status == "failed" {
			continue
		}
		if b.count(t, `SELECT count(*) FROM finance_cases c WHERE c.resolved_at IS NULL AND EXISTS (SELECT 1 FROM unnest(c.facts) f WHERE f LIKE '%' || $1 || '%')`, f[0]) == 0 {
			bad = append(bad, fmt.Sprintf("gateway refund %s (%s, %d of %s) is refund %s booked Failed, on no open case", gr.ID, gr.Status, gr.Amount, gr.PaymentID, f[0]))
			for _, e := range b.texts(t, `SELECT concat_ws(' | ', c.id, kind, c.created_at, resolved_at, resolution, facts::text) FROM finance_cases c JOIN refunds r ON r.session_id = c.session_id WHERE r.id = $1 ORDER BY c.id`, f[0]) {
				bad = append(bad, "    case: "+e)
			}
			for _, e := range b.texts(t, `SELECT concat_ws(' | ', e.created_at, e.from_status, e.to_status, e.actor_kind, r.detail) FROM refund_events e JOIN refunds r ON r.id = e.refund_id WHERE r.id = $1 ORDER BY e.id`, f[0]) {
				bad = append(bad, "    event: "+e)
			}
		}
	}
	return bad
}
