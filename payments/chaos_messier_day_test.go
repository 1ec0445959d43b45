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

	"github.com/google/uuid"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// lateGW is one replica's view of the shared fake gateway: when armed, an answer comes late (the
// caller's own gateway timeout minus a second, on the injected clock) and the other replica's
// patrol runs while it travels.
type lateGW struct {
	*fakegw.Gateway
	w       *chaos2
	self    int
	timeout time.Duration
}

func (g *lateGW) late(ctx context.Context, op string) {
	w := g.w
	w.mu.Lock()
	go_ := w.lateArmed > 0 && !w.inLate
	if go_ {
		w.lateArmed--
		w.inLate = true
	}
	w.mu.Unlock()
	if !go_ {
		return
	}
	w.b.clock.Advance(g.timeout - time.Second)
	other := w.svcs()[1-g.self]
	_, _ = other.SweepOnce(context.Background())
	_, _ = other.DriveRefunds(context.Background())
	_, _ = other.RetryWebhooksOnce(context.Background())
	w.logf("late %s answer on replica %d (+%s); the other replica's patrol ran", op, g.self, g.timeout-time.Second)
	w.mu.Lock()
	w.inLate = false
	w.mu.Unlock()
}

func (g *lateGW) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	g.w.mu.Lock()
	ignored := g.w.regKeysIgnored
	g.w.mu.Unlock()
	if ignored {
		// A gateway that does not honour registrations' keys (a fresh key each time: a second
		// payment); its refunds and reverses keep theirs, as the contract lets us trust them.
		req.IdempotencyKey += "/" + uuid.NewString()
	}
	p, err := g.Gateway.Register(ctx, req)
	g.late(ctx, "register")
	return p, err
}

func (g *lateGW) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	p, err := g.Gateway.Status(ctx, id)
	g.late(ctx, "status")
	return p, err
}

func (g *lateGW) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	p, err := g.Gateway.FindByReference(ctx, ref)
	g.late(ctx, "find")
	return p, err
}

func (g *lateGW) Reverse(ctx context.Context, id, key string) (payments.GatewayPayment, error) {
	p, err := g.Gateway.Reverse(ctx, id, key)
	g.late(ctx, "reverse")
	return p, err
}

func (g *lateGW) Refund(ctx context.Context, id, key string, amount int64, cur string) (payments.GatewayRefund, error) {
	r, err := g.Gateway.Refund(ctx, id, key, amount, cur)
	g.late(ctx, "refund")
	return r, err
}

func (g *lateGW) RefundStatus(ctx context.Context, rid string) (payments.GatewayRefund, error) {
	r, err := g.Gateway.RefundStatus(ctx, rid)
	g.late(ctx, "refund_status")
	return r, err
}

func (g *lateGW) FindRefund(ctx context.Context, pid, key string) (payments.GatewayRefund, bool, error) {
	r, ok, err := g.Gateway.FindRefund(ctx, pid, key)
	g.late(ctx, "find_refund")
	return r, ok, err
}

type chaos2 struct {
	*staffChaos
	acc       *access.Service
	lateArmed int
	inLate    bool
	foreign   map[string]bool // references of other shops' payments at the gateway
	bigJumps  int
	users     []payments.Staff
	ignoreRef map[string]bool // sessions registered while the gateway ignored keys
	// regKeysIgnored: the gateway ignores registrations' idempotency keys (lateGW.Register).
	regKeysIgnored bool
}

// staffCtx is a console session of u as it stands now.
func (w *chaos2) staffCtx(ctx context.Context, u payments.Staff) context.Context {
	var epoch int
	_ = w.b.pool.QueryRow(ctx, `SELECT session_epoch FROM staff_users WHERE email = $1`, u.Email).Scan(&epoch)
	return payments.WithStaffSession(ctx, u.Email, u.Role, epoch)
}

func (w *chaos2) disabled(ctx context.Context, email string) bool {
	var d bool
	_ = w.b.pool.QueryRow(ctx, `SELECT disabled_at IS NOT NULL FROM staff_users WHERE email = $1`, email).Scan(&d)
	return d
}

func (w *chaos2) newStep(ctx context.Context) {
	b := w.b
	switch a := w.intn(9); a {
	case 0: // a registration whose answers are lost at a gateway that ignores keys: a second payment
		w.mu.Lock()
		order := fmt.Sprintf("nokey-%d", len(w.orders))
		w.orders = append(w.orders, order)
		w.mu.Unlock()
		w.mu.Lock()
		armed := w.lateArmed
		w.lateArmed = 0 // no late answer (and the other replica's patrol) inside this step
		w.regKeysIgnored = true
		w.mu.Unlock()
		b.gw.Fail(fakegw.OpRegister, fakegw.LostAnswer, 1+w.intn(2))
		in := payments.CreateInput{OrderID: order, Amount: 1500, Currency: "EUR", CustomerContact: "c@example.com"}
		r, err := w.pickSvc().Create(ctx, api, in)
		w.logf("create (keys ignored) %s: %s %v", order, r.Session.Status, err)
		if w.intn(2) == 0 {
			r2, err := w.pickSvc().Create(ctx, api, in) // the shop's retry
			w.logf("create retry (keys ignored) %s: %s %v", order, r2.Session.Status, err)
		}
		if r.Session.ID != "" && w.intn(2) == 0 {
			_, _ = w.pickSvc().SweepOnce(ctx)
		}
		w.mu.Lock()
		w.regKeysIgnored = false
		w.lateArmed = armed
		w.mu.Unlock()
		if r.Session.ID != "" {
			w.mu.Lock()
			w.ignoreRef[r.Session.ID] = true
			w.mu.Unlock()
			// the customer pays one of them, maybe both
			for _, gp := range w.gatewayIDsOf(r.Session.ID) {
				if w.intn(2) == 0 {
					b.gw.SetStatus(gp, payments.GatewaySucceeded)
					w.logf("gateway %s (%s) captured", gp, r.Session.ID)
					if w.intn(2) == 0 {
						_, err := w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_cap_" + gp, Type: "payment.updated", PaymentID: gp, Reference: r.Session.ID})
						w.logf("webhook capture %s: %v", gp, err)
					}
				}
			}
		}
	case 1: // webhooks of other shops' payments on a shared gateway account
		ref := fmt.Sprintf("othershop-%d", w.intn(1000))
		w.mu.Lock()
		w.foreign[ref] = true
		w.mu.Unlock()
		gp, err := b.gw.Register(ctx, payments.RegisterRequest{Amount: 700, Currency: "EUR", Reference: ref, IdempotencyKey: "other-" + ref})
		if err != nil {
			return
		}
		b.gw.SetStatus(gp.ID, payments.GatewaySucceeded)
		refs := []string{ref, ""}
		if id, _, _, ok := w.randomSession(); ok && w.intn(4) == 0 {
			refs = append(refs, id) // a lying reference
		}
		r := refs[w.intn(len(refs))]
		res, err := w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_other_" + gp.ID + r, Type: "payment.updated", PaymentID: gp.ID, Reference: r})
		w.logf("foreign webhook %s ref %q: %s %v", gp.ID, r, res.Outcome, err)
		// an id the gateway does not know at all
		res, err = w.pickSvc().HandleGatewayEvent(ctx, payments.GatewayEvent{ID: fmt.Sprintf("evt_ghost_%d", w.intn(50)), Type: "payment.updated", PaymentID: fmt.Sprintf("gp_ghost_%d", w.intn(50))})
		w.logf("ghost webhook: %s %v", res.Outcome, err)
	case 2: // retention and reaping during the day
		_, err := w.pickSvc().Prune(ctx, payments.PruneConfig{GatewayCalls: time.Hour, WebhookEvents: time.Hour, Outbox: time.Hour, Actor: "cli:test"})
		n, err2 := w.pickSvc().ReapIdempotencyKeys(ctx, b.clock.Now(), 10)
		m, err3 := w.pickSvc().ReapCheckoutIntents(ctx)
		w.logf("prune %v; reap keys %d %v; reap intents %d %v", err, n, err2, m, err3)
	case 3: // a slow gateway: the next few answers come late
		w.mu.Lock()
		w.lateArmed += 1 + w.rng.IntN(3)
		w.mu.Unlock()
	case 4: // staff disabled, demoted or brought back
		u := w.users[w.intn(len(w.users))]
		switch w.intn(4) {
		case 0:
			_, err := w.acc.DisableUser(ctx, staffAdminUser, u.Email)
			w.logf("disable %s: %v", u.Email, err)
		case 1:
			role := []access.Role{access.RoleSupport, access.RoleFinance}[w.intn(2)]
			_, err := w.acc.SetRole(ctx, staffAdminUser, u.Email, role)
			w.logf("role %s %s: %v", u.Email, role, err)
		default:
			_, err := w.b.pool.Exec(ctx, `UPDATE staff_users SET disabled_at = NULL, role = $2 WHERE email = $1`, u.Email, u.Role)
			w.logf("restore %s: %v", u.Email, err)
		}
	case 5, 6: // a staff member acts in their console session (maybe offboarded meanwhile)
		u := w.users[w.intn(3)] // finance and admin
		was := w.disabled(ctx, u.Email)
		sctx := w.staffCtx(ctx, u)
		off := w.intn(3) == 0
		var wg sync.WaitGroup
		if off { // offboarded as they click
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = w.acc.DisableUser(ctx, staffAdminUser, u.Email)
			}()
		}
		var err error
		did := ""
		switch w.intn(5) {
		case 0:
			if id, ok := w.completedSession(ctx); ok {
				_, err = w.pickSvc().RefundByFinance(sctx, u, payments.StaffRefundInput{PaymentID: id, Amount: 100 * int64(1+w.intn(9)), Reason: "r", IntentKey: uuid.NewString()})
				did = "refund " + id
			}
		case 1:
			var pid int64
			if b.pool.QueryRow(ctx, `SELECT id FROM resolution_proposals WHERE state = 'proposed' ORDER BY md5(id::text || $1) LIMIT 1`, w.salt()).Scan(&pid) == nil {
				if w.intn(3) == 0 {
					_, err = w.pickSvc().RejectResolution(sctx, u, pid, "withdrawn")
					did = fmt.Sprintf("reject %d", pid)
				} else {
					_, err = w.pickSvc().ApproveResolution(sctx, u, pid)
					did = fmt.Sprintf("approve %d", pid)
				}
			}
		case 2:
			id, st, _, ok := w.randomSession()
			if ok && payments.Status(st).Active() {
				ch, cerr := w.pickSvc().RequestCancelOnce(sctx, u.Actor(), id, uuid.NewString())
				if cerr == nil {
					if f := w.intn(4); f < 2 {
						b.gw.Fail(fakegw.OpReverse, chaosFaults[f], 1)
					}
					_, err = w.pickSvc().ConfirmCancel(sctx, u.Actor(), id, ch.ID, w.code(id))
					did = "cancel " + id
				}
			}
		case 3:
			w.mu.Lock()
			order := fmt.Sprintf("staffstart-%d", len(w.orders))
			w.orders = append(w.orders, order)
			w.mu.Unlock()
			if w.intn(2) == 0 {
				b.gw.Fail(fakegw.OpRegister, chaosFaults[w.intn(3)], 1)
			}
			var r payments.CreateResult
			r, err = w.pickSvc().Create(sctx, u.Actor(), payments.CreateInput{OrderID: order, Amount: 1200, Currency: "EUR", CustomerContact: "c@example.com"})
			did = "start " + order + " " + string(r.Session.Status)
			if errors.Is(err, payments.ErrStaffSessionEnded) || errors.Is(err, payments.ErrStaffRoleChanged) {
				// "nothing was changed": then nothing was (a refusal of the gateway's answer
				// after the claim committed and the gateway registered it said so too).
				var n int
				_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM payment_sessions WHERE order_id = $1`, order).Scan(&n)
				if n != 0 {
					w.badf("staff %s's start of %s was refused as %q, but the order has %d session(s)", u.Email, order, err, n)
				}
			}
		default:
			var id string
			if b.pool.QueryRow(ctx, `SELECT id::text FROM payment_sessions WHERE flagged_at IS NOT NULL AND status IN ('Registering','Registered','Unknown','Authorized','Canceling') ORDER BY md5(order_id || $1) LIMIT 1`, w.salt()).Scan(&id) == nil {
				outcome := []payments.Status{payments.StatusCompleted, payments.StatusFailed, payments.StatusCanceled}[w.intn(3)]
				_, err = w.pickSvc().ProposeResolution(sctx, u, payments.ProposalInput{SessionID: id, Outcome: outcome, Reason: "gateway support", Evidence: "T-1"})
				did = "propose " + id
			}
		}
		wg.Wait()
		if did != "" {
			w.logf("staff %s (disabled before: %v, offboarded meanwhile: %v): %s: %v", u.Email, was, off, did, err)
			if was && err == nil {
				w.badf("staff %s, disabled before the click, did %s", u.Email, did)
			}
		}
	case 7: // the clock jumps far: past leases, code and key windows, a gateway's key retention
		if w.bigJumps < 2 {
			w.bigJumps++
			b.clock.Advance(25 * time.Hour)
			b.gw.ForgetRefundKeys()
			w.logf("clock +25h; the gateway forgot its refund keys")
		} else {
			b.clock.Advance(time.Duration(31+w.intn(300)) * time.Second)
		}
	default: // both patrols, at once
		var wg sync.WaitGroup
		for _, svc := range w.svcs() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = svc.SweepOnce(ctx)
				_, _ = svc.DriveRefunds(ctx)
				_, _ = svc.RetryWebhooksOnce(ctx)
			}()
		}
		wg.Wait()
	}
}

var staffAdminUser = payments.Staff{Email: "root@example.com", Role: "admin"}

// TestAMessierDayKeepsTheMoneyInvariants is a messy day (TestAMessyDayKeepsTheMoneyInvariants's
// steps half the time, the staff day's a fifth) with what those do not do: two replicas with
// different GATEWAY_TIMEOUTs whose answers come late while the other's patrol runs (lateGW), a
// gateway that ignores registrations' keys while their answers are lost (an unattached
// session's second payment), webhooks of other shops' payments and of payments nobody knows,
// prune and reaping during the day, staff disabled, given another role or brought back — a
// third of the time as they click (a finance refund, an approval or a rejection, a confirmed
// cancel, "Start a payment", a proposal) — and the clock jumping 25 hours past the gateway's
// refund keys. The day ends with the patrol past every window, and chaosInvariants and
// staffInvariants judge it. Written by an outside review (it found nothing the fixes before it
// had not); CHAOS2_SEED, CHAOS2_SEEDS (from 300, or CHAOS2_FROM more), CHAOS2_STEPS,
// CHAOS2_WORKERS (more than one worker's staff checks race one another's restores) and
// CHAOS2_LOG=1 widen it. Negative controls: a staff start's claim without queueStaffStands (a
// disabled user's click started a payment: seed 1), and detachRecord keeping the staff
// session (a start refused as "nothing was changed" left a session: seed 2).
func TestAMessierDayKeepsTheMoneyInvariants(t *testing.T) {
	t.Parallel()
	seeds, steps := chaosSeeds("CHAOS2", 300)
	if s := os.Getenv("CHAOS2_FROM"); s != "" {
		from, _ := strconv.ParseUint(s, 10, 64)
		for i := range seeds {
			seeds[i] += from
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runChaos2(t, seed, steps)
		})
	}
}

func runChaos2(t *testing.T, seed uint64, steps int) {
	ctx := context.Background()
	w := &chaos2{staffChaos: &staffChaos{chaosWorld: &chaosWorld{t: t, rng: rand.New(rand.NewPCG(seed, 55))}, pages: map[string][]staffPage{}},
		foreign: map[string]bool{}, ignoreRef: map[string]bool{}}
	base := func(c *payments.Config) {
		c.SweepConcurrency = 4
		c.Backoff = []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 3 * time.Hour}
		c.RefundDirectLimit = map[string]int64{"EUR": 700}
	}
	w.b = newBench(t, base)
	w.b.svc = w.b.service(w.b.pool, "replica-a", base, func(c *payments.Config) {
		c.GatewayTimeout = 5 * time.Second
		c.Gateway = &lateGW{Gateway: w.b.gw, w: w, self: 0, timeout: 5 * time.Second}
	})
	w.b.gw.SetKeyRetention(24 * time.Hour)
	w.other = w.b.service(testdb.Pool(t, w.b.url), "replica-b", base, func(c *payments.Config) {
		c.GatewayTimeout = 20 * time.Second
		c.Gateway = &lateGW{Gateway: w.b.gw, w: w, self: 1, timeout: 20 * time.Second}
	})
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
	workers := 1
	if s := os.Getenv("CHAOS2_WORKERS"); s != "" {
		workers, _ = strconv.Atoi(s)
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range steps / workers {
				switch r := w.intn(10); {
				case r < 5:
					w.step(ctx)
				case r < 7:
					w.staffStep(ctx)
				default:
					w.newStep(ctx)
				}
			}
		}()
	}
	wg.Wait()
	w.mu.Lock()
	w.lateArmed = 0
	w.mu.Unlock()
	w.endDay(ctx)
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
			id := strings.Fields(m)[1]
			if w.ignoreRef[id] {
				continue // by the gateway's fault; each captured one must be in the ledger or a case (checked above)
			}
		}
		bad = append(bad, m)
	}
	bad = append(bad, staffInvariants(t, w.b)...)
	if len(bad) > 0 || os.Getenv("CHAOS2_LOG") != "" {
		for _, l := range w.log {
			t.Log(l)
		}
		for _, s := range bad {
			t.Errorf("seed %d: %s", seed, s)
		}
	}
	t.Logf("seed %d in %s: sessions %v; cases %v; refunds %v; proposals %v", seed, time.Since(started).Round(time.Second),
		w.b.texts(t, `SELECT status || ':' || count(*) FROM payment_sessions GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || count(*) || '/' || count(resolved_at) FROM finance_cases GROUP BY kind ORDER BY 1`),
		w.b.texts(t, `SELECT status || ':' || count(*) FROM refunds GROUP BY status ORDER BY 1`),
		w.b.texts(t, `SELECT kind || ':' || state || ':' || count(*) FROM resolution_proposals GROUP BY kind, state ORDER BY 1`))
}
