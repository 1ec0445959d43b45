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

// staffChaos is a messy day (chaosWorld) in which staff act too, at random: finance refunds
// (direct and above the direct limit), support refunds with a customer's code (right or wrong),
// settlements and refund outcomes by four eyes (approved by a second person, sometimes tried by
// the proposer, rejected, raced), case resolutions, Check now, cancels with codes, unlocks —
// with forms whose `seen` was read a few steps earlier, the same form sent twice, and two staff
// at once on both replicas.
type staffChaos struct {
	*chaosWorld
	smu sync.Mutex
	// pages: what a staff member's page of a payment showed when it was read (refunds counted,
	// status), kept to be sent later as a stale `seen`.
	pages map[string][]staffPage
	// forms: refund forms sent once, to be sent again (the same intent key).
	forms []payments.StaffRefundInput
	// pairs: the intent keys of two forms of one page sent at once, both accepted: at the day's
	// end at most one of them may have moved money (a refund not Failed, or a proposal approved
	// or still waiting).
	pairs [][2]string
	// bad: what the day's actions broke on the spot (a proposer's approval accepted, two forms
	// of one page both refunding).
	bad []string
}

type staffPage struct {
	counted payments.RefundsSeen
	status  payments.Status
}

var (
	staffAdmin = payments.Staff{Email: "admin@example.com", Role: "admin"}
	staffFin   = []payments.Staff{fin1, fin2, staffAdmin}
)

func (w *staffChaos) badf(format string, args ...any) {
	w.smu.Lock()
	w.bad = append(w.bad, fmt.Sprintf(format, args...))
	w.smu.Unlock()
	w.logf("BAD: "+format, args...)
}

func (w *staffChaos) pickStaff() payments.Staff { return staffFin[w.intn(len(staffFin))] }

// readPage reads the payment's page as staff see it and remembers it.
func (w *staffChaos) readPage(ctx context.Context, id string) (staffPage, bool) {
	d, err := w.pickSvc().PaymentDetail(ctx, id)
	if err != nil {
		return staffPage{}, false
	}
	p := staffPage{counted: d.RefundsSeen(), status: d.Session.Status}
	w.smu.Lock()
	w.pages[id] = append(w.pages[id], p)
	w.smu.Unlock()
	return p, true
}

// seenOf is a page of the payment: fresh, or one read earlier (maybe stale), or none (nil).
func (w *staffChaos) seenOf(ctx context.Context, id string) (staffPage, bool) {
	w.smu.Lock()
	old := w.pages[id]
	w.smu.Unlock()
	if len(old) > 0 && w.intn(3) == 0 {
		return old[w.intn(len(old))], true
	}
	return w.readPage(ctx, id)
}

func (w *staffChaos) completedSession(ctx context.Context) (string, bool) {
	var id string
	err := w.b.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE status = 'Completed' ORDER BY md5(order_id || $1), created_at LIMIT 1`, w.salt()).Scan(&id)
	return id, err == nil
}

func (w *staffChaos) refundForm(ctx context.Context, id string) payments.StaffRefundInput {
	amounts := []int64{100, 200, 300, 400, 600, 900}
	form := payments.StaffRefundInput{PaymentID: id, Amount: amounts[w.intn(len(amounts))], Reason: "customer asked", IntentKey: uuid.NewString()}
	if w.intn(5) != 0 {
		if p, ok := w.seenOf(ctx, id); ok {
			seen := p.counted
			form.Seen = &seen
		}
	}
	return form
}

func (w *staffChaos) reuseForm() (payments.StaffRefundInput, bool) {
	w.smu.Lock()
	defer w.smu.Unlock()
	if len(w.forms) == 0 {
		return payments.StaffRefundInput{}, false
	}
	return w.forms[w.rng.IntN(len(w.forms))], true
}

func (w *staffChaos) keepForm(f payments.StaffRefundInput) {
	w.smu.Lock()
	w.forms = append(w.forms, f)
	w.smu.Unlock()
}

func seenText(s *payments.RefundsSeen) string {
	if s == nil {
		return "nil"
	}
	return s.String()
}

func (w *staffChaos) staffStep(ctx context.Context) {
	b := w.b
	switch a := w.intn(13); a {
	case 11, 12: // a customer pays an order at once (money for people to refund)
		w.mu.Lock()
		order := fmt.Sprintf("paid-%d", len(w.orders))
		w.orders = append(w.orders, order)
		w.mu.Unlock()
		r, err := w.pickSvc().Create(ctx, api, payments.CreateInput{OrderID: order, Amount: 1000 + 100*int64(w.intn(3)), Currency: "EUR", CustomerContact: "c@example.com"})
		if err != nil || r.Session.GatewayPaymentID == "" {
			return
		}
		b.gw.SetStatus(r.Session.GatewayPaymentID, payments.GatewaySucceeded)
		s, err := w.pickSvc().Check(ctx, api, r.Session.ID)
		w.logf("paid %s %s: %s %v", order, r.Session.ID, s.Status, err)
	case 0, 1: // finance refunds: direct or proposed, a stale page, the same form again, two at once
		if f := w.intn(6); f < 2 {
			b.gw.Fail(fakegw.OpRefund, chaosFaults[f], 1)
		}
		if w.intn(4) == 0 {
			b.gw.SetRefundOutcome("pending")
		} else {
			b.gw.SetRefundOutcome("succeeded")
		}
		if w.intn(4) == 0 {
			if form, ok := w.reuseForm(); ok {
				r, err := w.pickSvc().RefundByFinance(ctx, w.pickStaff(), form)
				w.logf("finance refund again %s %d intent %s: refund %v proposal %v replayed %v: %v", form.PaymentID, form.Amount, form.IntentKey,
					r.Refund != nil, r.Proposal != nil, r.Replayed, err)
				return
			}
		}
		id, ok := w.completedSession(ctx)
		if !ok {
			return
		}
		if w.intn(3) == 0 {
			// two finance users in two tabs of the same page: two forms with the same seen
			p, ok := w.readPage(ctx, id)
			if !ok {
				return
			}
			seen := p.counted
			amount := []int64{100, 300, 600}[w.intn(3)]
			var wg sync.WaitGroup
			res := make([]error, 2)
			did := make([]bool, 2)
			keys := make([]string, 2)
			for i, svc := range w.svcs() {
				wg.Add(1)
				go func() {
					defer wg.Done()
					form := payments.StaffRefundInput{PaymentID: id, Amount: amount, Reason: "ticket T", IntentKey: uuid.NewString(), Seen: &seen}
					keys[i] = "console/" + form.IntentKey
					r, err := svc.RefundByFinance(ctx, staffFin[i], form)
					res[i] = err
					did[i] = err == nil && (r.Refund != nil || r.Proposal != nil)
					w.keepForm(form)
				}()
			}
			wg.Wait()
			w.logf("finance refund x2 %s %d seen %s: %v / %v", id, amount, seen, res[0], res[1])
			if did[0] && did[1] {
				w.smu.Lock()
				w.pairs = append(w.pairs, [2]string{keys[0], keys[1]})
				w.smu.Unlock()
			}
			return
		}
		form := w.refundForm(ctx, id)
		by := w.pickStaff()
		if w.intn(4) == 0 { // a double click: the same form twice at once
			var wg sync.WaitGroup
			for _, svc := range w.svcs() {
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = svc.RefundByFinance(ctx, by, form) }()
			}
			wg.Wait()
			w.logf("finance refund dblclick %s %d seen %s", id, form.Amount, seenText(form.Seen))
		} else {
			r, err := w.pickSvc().RefundByFinance(ctx, by, form)
			w.logf("finance refund %s %d seen %s by %s: refund %v proposal %v: %v", id, form.Amount, seenText(form.Seen), by.Email, r.Refund != nil, r.Proposal != nil, err)
		}
		w.keepForm(form)
	case 2: // support refunds with the customer's code
		id, ok := w.completedSession(ctx)
		if !ok {
			return
		}
		if f := w.intn(6); f < 2 {
			b.gw.Fail(fakegw.OpRefund, chaosFaults[f], 1)
		}
		form := w.refundForm(ctx, id)
		ch, err := w.pickSvc().RequestRefundCode(ctx, supportStaff, form)
		if err != nil {
			w.logf("refund code %s seen %s: %v", id, seenText(form.Seen), err)
			return
		}
		if w.intn(3) == 0 {
			_, err := w.pickSvc().RequestRefundCode(ctx, supportStaff, form) // the same form again
			w.logf("refund code again %s: %v", id, err)
		}
		code := w.code(id)
		if w.intn(4) == 0 {
			wrong := fmt.Sprintf("%06d", (mustAtoi(code)+1+w.intn(999))%1_000_000)
			_, err := w.pickSvc().ConfirmRefund(ctx, supportStaff, id, ch.ID, wrong)
			w.logf("support refund wrong code %s: %v", id, err)
			if w.intn(2) == 0 {
				return
			}
		}
		if w.intn(3) == 0 {
			var wg sync.WaitGroup
			for _, svc := range w.svcs() {
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = svc.ConfirmRefund(ctx, supportStaff, id, ch.ID, code) }()
			}
			wg.Wait()
			w.logf("support refund confirm x2 %s", id)
		} else {
			r, err := w.pickSvc().ConfirmRefund(ctx, supportStaff, id, ch.ID, code)
			w.logf("support refund %s %d: %s %v", id, form.Amount, r.Refund.Status, err)
		}
	case 3, 4: // a waiting proposal: approved (by a second person, or tried by its proposer), raced, or rejected
		var pid int64
		var proposer, kind string
		if err := b.pool.QueryRow(ctx, `SELECT id, proposed_by, kind FROM resolution_proposals WHERE state = 'proposed' ORDER BY md5(order_id || kind || $1), proposed_at LIMIT 1`, w.salt()).Scan(&pid, &proposer, &kind); err != nil {
			return
		}
		var self payments.Staff
		for _, s := range staffFin {
			if s.Email == proposer {
				self = s
			}
		}
		switch r := w.intn(6); {
		case r == 0: // the proposer tries
			_, err := w.pickSvc().ApproveResolution(ctx, self, pid)
			w.logf("self-approve %d (%s) by %s: %v", pid, kind, proposer, err)
			if err == nil {
				w.badf("proposal %d (%s) approved by its proposer %s", pid, kind, proposer)
			}
		case r == 1: // rejected, by the proposer or another
			by := w.pickStaff()
			_, err := w.pickSvc().RejectResolution(ctx, by, pid, "not convinced")
			w.logf("reject %d (%s) by %s: %v", pid, kind, by.Email, err)
		case r == 2: // two approvers at once, one of them maybe the proposer, and a rejection beside
			var wg sync.WaitGroup
			errs := make([]error, 3)
			who := []payments.Staff{w.pickStaff(), w.pickStaff()}
			for i, svc := range w.svcs() {
				wg.Add(1)
				go func() { defer wg.Done(); _, errs[i] = svc.ApproveResolution(ctx, who[i], pid) }()
			}
			if w.intn(3) == 0 {
				wg.Add(1)
				go func() { defer wg.Done(); _, errs[2] = w.other.RejectResolution(ctx, self, pid, "withdrawn") }()
			}
			wg.Wait()
			w.logf("approve x2 %d (%s) by %s/%s: %v / %v / reject %v", pid, kind, who[0].Email, who[1].Email, errs[0], errs[1], errs[2])
			for i := range 2 {
				if errs[i] == nil && who[i].Email == proposer {
					w.badf("proposal %d (%s) approved by its proposer %s (concurrently)", pid, kind, proposer)
				}
			}
		default:
			by := w.pickStaff()
			for by.Email == proposer {
				by = w.pickStaff()
			}
			if kind == payments.ProposalRefund && w.intn(3) == 0 {
				if f := w.intn(3); f < 2 {
					b.gw.Fail(fakegw.OpRefund, chaosFaults[f], 1)
				}
			}
			_, err := w.pickSvc().ApproveResolution(ctx, by, pid)
			w.logf("approve %d (%s) by %s: %v", pid, kind, by.Email, err)
		}
	case 5: // a settlement proposed for a flagged payment, maybe from a page read earlier
		var id string
		if err := b.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE (flagged_at IS NOT NULL OR status = 'Unknown') AND status IN ('Registering','Registered','Unknown','Authorized','Canceling') ORDER BY md5(order_id || $1), created_at LIMIT 1`, w.salt()).Scan(&id); err != nil {
			return
		}
		p, ok := w.seenOf(ctx, id)
		if !ok {
			return
		}
		outcome := []payments.Status{payments.StatusCompleted, payments.StatusFailed, payments.StatusCanceled}[w.intn(3)]
		by := w.pickStaff()
		r, err := w.pickSvc().ProposeResolution(ctx, by, payments.ProposalInput{SessionID: id, Outcome: outcome, Reason: "gateway support says so",
			Evidence: "ticket FIN-3", Seen: p.status})
		w.logf("propose %s %s seen %s by %s: %d %v", id, outcome, p.status, by.Email, r.ID, err)
	case 6: // an outcome proposed for a flagged refund, as the gateway has it
		var rid, sid, gp string
		if err := b.pool.QueryRow(ctx, `SELECT r.id::text, r.session_id::text, coalesce(s.gateway_payment_id, '') FROM refunds r JOIN payment_sessions s ON s.id = r.session_id
			WHERE r.status = 'Pending' AND r.flagged_at IS NOT NULL ORDER BY md5(r.order_id || r.amount || $1), r.created_at LIMIT 1`, w.salt()).Scan(&rid, &sid, &gp); err != nil {
			return
		}
		gr, found, err := b.gw.FindRefund(ctx, gp, rid)
		if err != nil {
			return
		}
		outcome := payments.RefundFailed
		if found {
			if gr.Status == "failed" {
				outcome = payments.RefundFailed
			} else {
				outcome = payments.RefundSucceeded
				b.gw.SetRefundStatus(gp, "succeeded") // what gateway support confirms
			}
		}
		by := w.pickStaff()
		r, err := w.pickSvc().ProposeRefundOutcome(ctx, by, payments.RefundOutcomeInput{RefundID: rid, Outcome: outcome, Reason: "gateway support", Evidence: "ticket R-1"})
		w.logf("propose refund outcome %s %s by %s: %d %v", rid, outcome, by.Email, r.ID, err)
	case 7: // a case resolved, with the case as read now, or earlier, or not said
		page, err := w.pickSvc().ListCases(ctx, false, 0)
		if err != nil || len(page.Cases) == 0 {
			return
		}
		c := page.Cases[w.intn(len(page.Cases))]
		seen := c.Seen()
		if w.intn(4) == 0 {
			seen = ""
		}
		_, err = w.pickSvc().ResolveCase(ctx, w.pickStaff(), c.ID, "handled at the gateway, ticket FIN-9", seen)
		w.logf("resolve case %d (%s): %v", c.ID, c.Kind, err)
	case 8: // Check now by two finance users at once, on both replicas
		var ids []string
		rows, err := b.pool.Query(ctx, `SELECT id::text FROM payment_sessions WHERE status IN ('Registering','Registered','Unknown','Authorized','Canceling') ORDER BY md5(order_id || $1), created_at LIMIT 3`, w.salt())
		if err != nil {
			return
		}
		for rows.Next() {
			var id string
			_ = rows.Scan(&id)
			ids = append(ids, id)
		}
		rows.Close()
		if len(ids) == 0 {
			return
		}
		if w.intn(2) == 0 {
			b.gw.Fail(fakegw.OpStatus, chaosFaults[w.intn(2)], 1)
		}
		var wg sync.WaitGroup
		for i, svc := range w.svcs() {
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = svc.CheckNow(ctx, staffFin[i], ids) }()
		}
		wg.Wait()
		w.logf("check now x2 %v", ids)
	default: // support cancels with a code (the same form twice, wrong codes), finance unlocks
		id, st, _, ok := w.randomSession()
		if !ok || !payments.Status(st).Active() {
			return
		}
		intent := uuid.NewString()
		ch, err := w.pickSvc().RequestCancelOnce(ctx, supportStaff.Actor(), id, intent)
		if err != nil {
			w.logf("staff cancel request %s: %v", id, err)
			if payments.ErrorCode(err) == payments.ELOCKED && w.intn(2) == 0 {
				n, err := w.pickSvc().UnlockCodes(ctx, fin1, id, "customer called back")
				w.logf("unlock codes %s: %d %v", id, n, err)
			}
			return
		}
		if w.intn(3) == 0 {
			_, err := w.pickSvc().RequestCancelOnce(ctx, supportStaff.Actor(), id, intent)
			w.logf("staff cancel request again %s: %v", id, err)
		}
		code := w.code(id)
		for range w.intn(3) {
			wrong := fmt.Sprintf("%06d", (mustAtoi(code)+1+w.intn(999))%1_000_000)
			_, err := w.pickSvc().ConfirmCancel(ctx, supportStaff.Actor(), id, ch.ID, wrong)
			w.logf("staff cancel wrong code %s: %v", id, err)
		}
		if w.intn(4) == 0 {
			return // the customer hung up
		}
		if f := w.intn(4); f < 2 {
			b.gw.Fail(fakegw.OpReverse, chaosFaults[f], 1)
		}
		if w.intn(3) == 0 {
			var wg sync.WaitGroup
			for _, svc := range w.svcs() {
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = svc.ConfirmCancel(ctx, supportStaff.Actor(), id, ch.ID, code) }()
			}
			wg.Wait()
			w.logf("staff cancel confirm x2 %s", id)
		} else {
			r, err := w.pickSvc().ConfirmCancel(ctx, supportStaff.Actor(), id, ch.ID, code)
			w.logf("staff cancel confirm %s: %s %v", id, r.Session.Status, err)
		}
	}
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// TestAStaffDayKeepsTheMoneyInvariants: seeded messy days where staff act at random beside the
// shop, the customers, the gateway and both replicas' patrols (staffChaos): 3 seeds × 300 steps in
// make test, 12 × 1,000 in make polygon. STAFF_CHAOS_SEED=N (one seed), STAFF_CHAOS_SEEDS=N,
// STAFF_CHAOS_STEPS widen it. Kept from an outside review; its seed 200 found refunds sent for
// payment "" after a settle by hand (TestARefundOfAPaymentSettledByHandWaitsForItsGatewayID).
func TestAStaffDayKeepsTheMoneyInvariants(t *testing.T) {
	t.Parallel()
	seeds, steps := chaosSeeds("STAFF_CHAOS", 200)
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runStaffChaos(t, seed, steps)
		})
	}
}

func runStaffChaos(t *testing.T, seed uint64, steps int) {
	ctx := context.Background()
	w := &staffChaos{chaosWorld: &chaosWorld{t: t, rng: rand.New(rand.NewPCG(seed, 77))}, pages: map[string][]staffPage{}}
	mod := func(c *payments.Config) {
		c.LeaseDuration, c.GatewayTimeout = 30*time.Second, 5*time.Second
		c.SweepConcurrency = 4
		c.Backoff = []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 3 * time.Hour}
		c.RefundDirectLimit = map[string]int64{"EUR": 700}
	}
	w.b = newBench(t, mod)
	w.other = w.b.service(testdb.Pool(t, w.b.url), "replica-b", mod)
	w.start = w.b.clock.Now()
	started := time.Now()
	for range steps {
		if w.intn(5) < 3 {
			w.step(ctx)
		} else {
			w.staffStep(ctx)
		}
	}
	w.endDay(ctx)
	bad := append([]string{}, w.bad...)
	for _, p := range w.pairs {
		moved := w.b.count(t, `SELECT count(*) FROM refunds WHERE request_key = ANY($1) AND status <> 'Failed'`, p[:]) +
			w.b.count(t, `SELECT count(*) FROM resolution_proposals WHERE request_key = ANY($1) AND state = 'proposed'`, p[:]) +
			w.b.count(t, `SELECT count(*) FROM resolution_proposals p WHERE request_key = ANY($1) AND state = 'approved' AND NOT EXISTS (
				SELECT 1 FROM refunds r WHERE r.id = p.refund_id)`, p[:])
		if moved > 1 {
			bad = append(bad, fmt.Sprintf("two finance forms of one page both moved money: %v", p))
		}
	}
	for _, m := range chaosInvariants(t, w.b) {
		if known := knownByHand(t, w.b, m); known != "" {
			w.logf("by design (%s): %s", known, m)
			continue
		}
		bad = append(bad, m)
	}
	bad = append(bad, staffInvariants(t, w.b)...)
	if len(bad) > 0 {
		for _, l := range w.log {
			t.Log(l)
		}
		for _, s := range bad {
			t.Errorf("seed %d: %s", seed, s)
		}
		if os.Getenv("STAFF_CHAOS_DUMP") != "" {
			for _, r := range w.b.texts(t, `SELECT concat_ws(' | ', r.id, r.session_id, r.amount, r.status, r.gateway_refund_id, r.created_by, r.created_at, r.flagged_at, r.flag_reason, r.detail) FROM refunds r ORDER BY created_at`) {
				t.Log("refund: " + r)
			}
			for _, r := range w.b.texts(t, `SELECT concat_ws(' | ', id, session_id, kind, created_at, resolved_at, detail, facts::text) FROM finance_cases ORDER BY id`) {
				t.Log("case: " + r)
			}
			for _, r := range w.b.texts(t, `SELECT concat_ws(' | ', id, session_id, operation, idempotency_key, outcome, detail, replica_id, created_at) FROM gateway_calls WHERE operation LIKE '%refund%' ORDER BY id`) {
				t.Log("call: " + r)
			}
			for _, r := range w.b.texts(t, `SELECT concat_ws(' | ', id, kind, session_id, state, proposed_by, decided_by, refund_amount, refund_id, refund_outcome, outcome, status_at_proposal, decision_note) FROM resolution_proposals ORDER BY id`) {
				t.Log("proposal: " + r)
			}
		}
	}
	t.Logf("seed %d in %s: sessions %v; cases %v; refunds %v; proposals %v; audit %v", seed, time.Since(started).Round(time.Second),
		w.b.texts(t, `SELECT status || ':' || count(*) FROM payment_sessions GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || count(*) || '/' || count(resolved_at) FROM finance_cases GROUP BY kind ORDER BY 1`),
		w.b.texts(t, `SELECT status || ':' || count(*) || ':' || split_part(created_by, ':', 1) FROM refunds GROUP BY status, split_part(created_by, ':', 1) ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || state || ':' || count(*) FROM resolution_proposals GROUP BY kind, state ORDER BY 1`),
		w.b.texts(t, `SELECT action || ':' || count(*) FROM audit_log GROUP BY action ORDER BY 1`))
}

// knownByHand says why a finding of chaosInvariants is what people settling by hand leave
// behind by design ("" when it is not): a refund settled Succeeded by four eyes whose gateway id
// was never learnt (its gateway refund is found by our key).
func knownByHand(t *testing.T, b *bench, m string) string {
	ctx := context.Background()
	var rid, gp string
	if _, err := fmt.Sscanf(m, "gateway refund %s", &rid); err == nil && strings.Contains(m, "has 0 refund rows") {
		r, err := b.gw.RefundStatus(ctx, rid)
		if err != nil {
			return ""
		}
		gp = r.PaymentID
		for _, id := range b.texts(t, `SELECT r.id::text FROM refunds r JOIN payment_sessions s ON s.id = r.session_id WHERE s.gateway_payment_id = $1
			AND r.gateway_refund_id IS NULL AND r.status = 'Succeeded' AND r.detail LIKE 'settled by hand:%'`, gp) {
			if g, found, _ := b.gw.FindRefund(ctx, gp, id); found && g.ID == rid {
				return "refund " + id + " settled Succeeded by hand, its gateway id unknown"
			}
		}
		return ""
	}
	if strings.HasSuffix(m, "Succeeded refunds without a gateway refund") {
		if b.count(t, `SELECT count(*) FROM refunds WHERE status = 'Succeeded' AND gateway_refund_id IS NULL AND detail NOT LIKE 'settled by hand:%'`) == 0 {
			return "settled Succeeded by hand"
		}
	}
	return ""
}

// staffInvariants checks what staff actions promise.
func staffInvariants(t *testing.T, b *bench) []string {
	ctx := context.Background()
	var bad []string
	q := func(sql string, args ...any) int { return b.count(t, sql, args...) }
	list := func(what, sql string) {
		for _, r := range b.texts(t, sql) {
			bad = append(bad, what+": "+r)
		}
	}
	// Per payment: the refunds that count stay within what was received.
	list("refunds above the amount received", `SELECT s.id || ' ' || s.amount || ' < ' || sum(r.amount) FROM payment_sessions s JOIN refunds r ON r.session_id = s.id
		WHERE r.status <> 'Failed' GROUP BY s.id, s.amount HAVING sum(r.amount) > s.amount`)
	// No RefundIssued for a refund that is not Succeeded; one for each Succeeded one.
	list("RefundIssued of a refund not Succeeded", `SELECT r.id || ' ' || r.status FROM refunds r JOIN accounting_entries a ON a.refund_id = r.id WHERE r.status <> 'Succeeded'`)
	list("Succeeded refund without exactly one RefundIssued", `SELECT r.id || ' ' || count(a.id) FROM refunds r LEFT JOIN accounting_entries a ON a.refund_id = r.id AND a.entry_type = 'RefundIssued'
		WHERE r.status = 'Succeeded' GROUP BY r.id HAVING count(a.id) <> 1`)
	// The gateway's side: what it paid back per payment stays within what it captured.
	paid := map[string]int64{}
	for i := 1; i < 4000; i++ {
		rid := "rf_fake_" + strconv.Itoa(i)
		r, err := b.gw.RefundStatus(ctx, rid)
		if err != nil {
			continue
		}
		if r.Status != "failed" {
			paid[r.PaymentID] += r.Amount
		}
	}
	for gp, n := range paid {
		p, _ := b.gw.Payment(gp)
		var amount int64
		_ = b.pool.QueryRow(ctx, `SELECT amount FROM payment_sessions WHERE id::text = $1`, p.Reference).Scan(&amount)
		if n > amount {
			bad = append(bad, fmt.Sprintf("gateway payment %s (%s) of %d paid back %d", gp, p.Reference, amount, n))
		}
	}
	// Proposals: never approved by their proposer; each approved one has its one effect.
	list("approved by its proposer", `SELECT id || ' ' || proposed_by FROM resolution_proposals WHERE state = 'approved' AND decided_by = proposed_by`)
	list("approved refund proposal without its one refund", `SELECT p.id::text FROM resolution_proposals p WHERE p.kind = 'refund' AND p.state = 'approved'
		AND (p.refund_id IS NULL OR (SELECT count(*) FROM refunds r WHERE r.session_id = p.session_id AND r.request_key = p.request_key) <> 1)`)
	list("approved settlement without its one transition", `SELECT p.id::text FROM resolution_proposals p WHERE p.kind = 'settle' AND p.state = 'approved'
		AND (SELECT count(*) FROM session_events e WHERE e.session_id = p.session_id AND e.to_status = p.outcome AND e.reason LIKE 'four-eyes resolution #' || p.id || ':%') <> 1`)
	list("approved refund outcome without its one settlement", `SELECT p.id::text FROM resolution_proposals p WHERE p.kind = 'refund_settle' AND p.state = 'approved'
		AND (SELECT count(*) FROM refunds r WHERE r.id = p.refund_id AND r.status = p.refund_outcome AND r.detail LIKE 'settled by hand: resolution #' || p.id || ',%') <> 1`)
	list("proposal effect without approval", `SELECT r.id || ' by proposal ' || p.id || ' ' || p.state FROM resolution_proposals p JOIN refunds r ON r.session_id = p.session_id AND r.request_key = p.request_key
		WHERE p.kind = 'refund' AND p.state <> 'approved'`)
	// Audit: every refund a person made, every approval, every cancel a person confirmed.
	list("staff refund without its audit row", `SELECT r.id || ' ' || r.created_by FROM refunds r WHERE r.created_by LIKE 'staff:%'
		AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.target = r.session_id::text AND a.action IN ('payment.refund', 'payment.refund_confirm', 'resolution.approve') AND a.detail LIKE '%' || r.id || '%')`)
	list("approval without its audit row", `SELECT p.id::text FROM resolution_proposals p WHERE p.state = 'approved'
		AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.action = 'resolution.approve' AND a.actor = p.decided_by AND a.detail LIKE '#' || p.id || ' %')`)
	list("staff cancel without its audit row", `SELECT e.session_id || ' ' || e.actor_id FROM session_events e WHERE e.to_status = 'Canceling' AND e.actor_kind = 'staff'
		AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.target = e.session_id::text AND a.action = 'payment.cancel_confirm')`)
	if n := q(`SELECT count(*) FROM (SELECT session_id FROM resolution_proposals WHERE state = 'proposed' GROUP BY session_id HAVING count(*) > 1) x`); n > 0 {
		bad = append(bad, "several proposals waiting for one payment")
	}
	_ = strings.Contains
	return bad
}
