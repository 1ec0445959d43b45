package e2e_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"pitlane/handlers"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
	"pitlane/payments/gateway/refgw"
	"pitlane/web"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const (
	apiKey        = "sim_e2e_key"
	webhookSecret = "whsec_e2e_0123456789"
)

var api = payments.Actor{Kind: payments.ActorAPI, ID: "e2e"}

// bench is one database, the simulator behind an httptest server, the refgw client pointed at
// it, a manual clock shared by the core and the simulator, and the service.
type bench struct {
	pool  *pgxpool.Pool
	clock *payments.ManualClock
	sim   *gatewaysim.Sim
	gw    *refgw.Client
	svc   *payments.Service
}

type options struct {
	webhookURL string // the simulator sends signed webhooks here
}

func newBench(t *testing.T, opts options) *bench {
	t.Helper()
	b := &bench{pool: testdb.New(t), clock: payments.NewManualClock(t0)}
	b.sim = gatewaysim.New(gatewaysim.Options{APIKey: apiKey, Now: b.clock.Now, WebhookURL: opts.webhookURL,
		WebhookSecret: webhookSecret, WebhookBackoff: 10 * time.Millisecond})
	srv := httptest.NewServer(b.sim)
	t.Cleanup(func() {
		_ = b.sim.Close()
		srv.Close()
	})
	var err error
	b.gw, err = refgw.New(refgw.Options{BaseURL: srv.URL, APIKey: apiKey, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.gw.CloseIdleConnections)
	b.svc = payments.NewService(b.pool, payments.Config{Gateway: b.gw, Clock: b.clock, ReplicaID: "replica-e2e",
		CodeSecret: []byte("e2e-secret"), LockTimeout: 10 * time.Second, GatewayURL: srv.URL})
	return b
}

func (b *bench) create(t *testing.T, order string) payments.Session {
	t.Helper()
	res, err := b.svc.Create(context.Background(), api, payments.CreateInput{OrderID: order, Amount: 2500, Currency: "EUR"})
	if err != nil {
		t.Fatalf("create %s: %v", order, err)
	}
	return res.Session
}

// sweepDue moves the clock past the first look at a registration without its answer (the
// first backoff step, or RegisterGrace after the send when no answer came at all: the gateway
// may still be processing it) and runs one sweeper round.
func (b *bench) sweepDue(t *testing.T) {
	t.Helper()
	b.clock.Advance(max(payments.DefaultBackoff[0], payments.StaleAfterFor(0)) + time.Second)
	if _, err := b.svc.SweepOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (b *bench) get(t *testing.T, id string) payments.Session {
	t.Helper()
	s, err := b.svc.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// onePayment requires that the simulator holds exactly one payment with the session's reference,
// and that it is the one the session points at.
func (b *bench) onePayment(t *testing.T, s payments.Session) {
	t.Helper()
	ps := b.sim.PaymentsByReference(s.Reference())
	if len(ps) != 1 {
		t.Fatalf("the gateway holds %d payments for session %s, want exactly 1", len(ps), s.ID)
	}
	if s.GatewayPaymentID != ps[0].ID {
		t.Fatalf("session points at %q, the gateway's payment is %s", s.GatewayPaymentID, ps[0].ID)
	}
}

// TestLostRegisterAnswerCheckResolves: the gateway registers the payment and the answer is lost;
// the session is Unknown (never Failed); Check finds the payment by our reference and attaches it.
func TestLostRegisterAnswerCheckResolves(t *testing.T) {
	t.Parallel()
	b := newBench(t, options{})
	b.sim.DropNext(gatewaysim.OpRegister, 1)
	s := b.create(t, "e2e-lost-answer")
	if s.Status != payments.StatusUnknown || s.GatewayPaymentID != "" {
		t.Fatalf("after a lost answer: %s %q, want Unknown with no gateway id", s.Status, s.GatewayPaymentID)
	}
	if n := len(b.sim.PaymentsByReference(s.Reference())); n != 1 {
		t.Fatalf("the gateway holds %d payments, want 1 (it processed the request)", n)
	}

	s, err := b.svc.Check(context.Background(), api, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != payments.StatusRegistered {
		t.Fatalf("after Check: %s, want Registered", s.Status)
	}
	b.onePayment(t, s)
	if n := b.sim.CallCount(gatewaysim.OpRegister); n != 1 {
		t.Errorf("%d register calls, want 1: Check must not register again", n)
	}

	// The customer pays; the next Check completes it, once.
	if _, err := b.sim.Succeed(s.GatewayPaymentID); err != nil {
		t.Fatal(err)
	}
	if s, err = b.svc.Check(context.Background(), api, s.ID); err != nil || s.Status != payments.StatusCompleted {
		t.Fatalf("after paying: %v %v, want Completed", s.Status, err)
	}
}

// TestServerErrorBeforeProcessingIsRetriedWithTheSameKey: a 503 before processing is no answer;
// the session is Unknown; the gateway has nothing under our reference, so the sweeper registers
// again with the same key, and one payment results.
func TestServerErrorBeforeProcessingIsRetriedWithTheSameKey(t *testing.T) {
	t.Parallel()
	b := newBench(t, options{})
	b.sim.FailNext(gatewaysim.OpRegister, 1)
	s := b.create(t, "e2e-503")
	if s.Status != payments.StatusUnknown {
		t.Fatalf("after a 503: %s, want Unknown", s.Status)
	}
	if n := len(b.sim.PaymentsByReference(s.Reference())); n != 0 {
		t.Fatalf("the gateway holds %d payments after a 503 before processing, want 0", n)
	}

	b.sweepDue(t)
	s = b.get(t, s.ID)
	if s.Status != payments.StatusRegistered {
		t.Fatalf("after the sweeper: %s, want Registered", s.Status)
	}
	b.onePayment(t, s)
	if n := b.sim.KeyCallCount(s.ID); n != 2 {
		t.Errorf("%d calls carried the session's key, want 2 (the 503 and the retry)", n)
	}
	if n := b.sim.CallCount(gatewaysim.OpFind); n != 1 {
		t.Errorf("%d reference searches, want 1 (the sweeper looks before it registers again)", n)
	}
}

// TestKeysIgnoredLostAnswerStillOnePaymentPerSession: a gateway that cannot be trusted with
// idempotency keys, and every registration answer lost. The sweeper looks each payment up by our
// reference before sending anything again, so every session ends with exactly one gateway payment.
func TestKeysIgnoredLostAnswerStillOnePaymentPerSession(t *testing.T) {
	t.Parallel()
	b := newBench(t, options{})
	b.sim.SetIgnoreIdempotencyKeys(true)
	b.sim.DropNext(gatewaysim.OpRegister, 3)
	var sessions []payments.Session
	for _, order := range []string{"e2e-ignored-1", "e2e-ignored-2", "e2e-ignored-3"} {
		s := b.create(t, order)
		if s.Status != payments.StatusUnknown {
			t.Fatalf("%s: %s, want Unknown", order, s.Status)
		}
		sessions = append(sessions, s)
	}

	b.sweepDue(t)
	for _, s := range sessions {
		s = b.get(t, s.ID)
		if s.Status != payments.StatusRegistered {
			t.Fatalf("session %s after the sweeper: %s, want Registered", s.ID, s.Status)
		}
		b.onePayment(t, s)
	}
	if n := b.sim.CallCount(gatewaysim.OpRegister); n != 3 {
		t.Errorf("%d register calls for 3 sessions, want 3: nothing may be sent again", n)
	}

	// Control: this simulator really ignores keys, so registering again with the same key would
	// have made a second payment. The one-payment result above is the lookup's doing.
	s := sessions[0]
	if _, err := b.gw.Register(context.Background(), payments.RegisterRequest{IdempotencyKey: s.ID, Reference: s.Reference(),
		Amount: s.Amount, Currency: s.Currency}); err != nil {
		t.Fatal(err)
	}
	if n := len(b.sim.PaymentsByReference(s.Reference())); n != 2 {
		t.Fatalf("control: a repeat with the same key made %d payments in keys-ignored mode, want 2", n)
	}
}

// TestSimulatorWebhooksSettleSessions: the simulator's signed webhooks, duplicated three times
// and sent newest first, reach the real router; the customer's approval completes the session
// without anyone calling Check, with one Completed event and one ledger entry.
func TestSimulatorWebhooksSettleSessions(t *testing.T) {
	t.Parallel()
	var receiver http.Handler
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { receiver.ServeHTTP(w, r) }))
	t.Cleanup(front.Close)
	b := newBench(t, options{webhookURL: front.URL + "/webhooks/gateway"})
	verifier, err := refgw.NewWebhookVerifier([]string{webhookSecret})
	if err != nil {
		t.Fatal(err)
	}
	receiver = web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: b.pool, ReplicaID: "replica-e2e", Payments: b.svc,
		Webhooks: handlers.WebhookConfig{Verifier: verifier}})
	b.sim.SetWebhookFaults(gatewaysim.WebhookFaults{Duplicate: 3, Reorder: true})

	paid := b.create(t, "e2e-webhook-paid")
	declined := b.create(t, "e2e-webhook-declined")
	if _, err := b.sim.Approve(paid.GatewayPaymentID); err != nil { // zero capture delay: captured at once
		t.Fatal(err)
	}
	if _, err := b.sim.Decline(declined.GatewayPaymentID, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.sim.WebhooksIdle(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range b.sim.Deliveries() {
		if d.HTTPStatus != http.StatusOK {
			t.Errorf("delivery %+v was not accepted", d)
		}
	}
	if s := b.get(t, paid.ID); s.Status != payments.StatusCompleted {
		t.Errorf("paid session: %s, want Completed", s.Status)
	}
	if s := b.get(t, declined.ID); s.Status != payments.StatusFailed {
		t.Errorf("declined session: %s, want Failed", s.Status)
	}
	var completed, ledger, events int
	if err := b.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status = 'Completed'),
		(SELECT count(*) FROM accounting_entries),
		(SELECT count(*) FROM webhook_events WHERE processed_at IS NOT NULL)`, paid.ID).Scan(&completed, &ledger, &events); err != nil {
		t.Fatal(err)
	}
	if completed != 1 || ledger != 1 {
		t.Errorf("%d Completed events and %d ledger entries, want 1 and 1", completed, ledger)
	}
	if events != 3 { // authorized, succeeded, declined: each recorded once however often it came
		t.Errorf("%d events processed, want 3", events)
	}
}
