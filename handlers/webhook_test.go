package handlers_test

// Tests of the webhook receiver, through the real router (web.New: middleware, routes, the one
// error handler) over a real database, a fake gateway that counts what it is asked and a manual
// clock. Helpers are prefixed "wh" to stay clear of the API tests' helpers in this package.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v82/webhook"

	"pitlane/handlers"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/payments/gateway/refgw"
	"pitlane/payments/gateway/stripegw"
	"pitlane/payments/gateway/webhooksig"
	"pitlane/web"
)

const (
	whSecret    = "whsec_test_0123456789abcdef"
	whSecretOld = "whsec_test_previous_secret"
)

var whT0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// whScheme is one gateway's webhook protocol as the receiver meets it: its adapter's verifier,
// the header it signs in, how it signs and what its events look like. The receiver's contract
// (pitlane-api.md, "Webhook receiver") must hold for every one of them.
type whScheme struct {
	name     string
	verifier func(t *testing.T, secrets ...string) payments.WebhookVerifier
	header   string
	sign     func(secret string, at time.Time, body []byte) string
	event    func(id string, s payments.Session, gatewayPaymentID, status string) []byte
}

var (
	whRefgw = whScheme{
		name:     "refgw",
		verifier: whVerifier(refgw.NewWebhookVerifier),
		header:   webhooksig.Header,
		sign: func(secret string, at time.Time, body []byte) string {
			return webhooksig.Sign([]byte(secret), at, body)
		},
		event: whEvent,
	}
	whStripe = whScheme{
		name:     "stripe",
		verifier: whVerifier(stripegw.NewWebhookVerifier),
		header:   stripegw.SignatureHeader,
		sign: func(secret string, at time.Time, body []byte) string {
			return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: at}).Header
		},
		event: whStripeEvent,
	}
	whSchemes = []whScheme{whRefgw, whStripe}
)

// whVerifier adapts an adapter's verifier constructor to whScheme.verifier.
func whVerifier[V payments.WebhookVerifier](build func([]string) (V, error)) func(*testing.T, ...string) payments.WebhookVerifier {
	return func(t *testing.T, secrets ...string) payments.WebhookVerifier {
		t.Helper()
		v, err := build(secrets)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

type whBench struct {
	scheme whScheme
	pool   *pgxpool.Pool
	gw     *fakegw.Gateway
	clock  *payments.ManualClock
	svc    *payments.Service
	e      *echo.Echo
}

// newWHBench wires the receiver with scheme's verifier over secrets (default: whSecret alone).
func newWHBench(t *testing.T, scheme whScheme, secrets ...string) *whBench {
	t.Helper()
	if len(secrets) == 0 {
		secrets = []string{whSecret}
	}
	return newWHBenchWith(t, scheme, handlers.WebhookConfig{Verifier: scheme.verifier(t, secrets...)})
}

func newWHBenchWith(t *testing.T, scheme whScheme, cfg handlers.WebhookConfig) *whBench {
	t.Helper()
	b := &whBench{scheme: scheme, pool: testdb.New(t), gw: fakegw.New(), clock: payments.NewManualClock(whT0)}
	b.svc = payments.NewService(b.pool, payments.Config{Gateway: b.gw, Clock: b.clock, ReplicaID: "replica-wh",
		CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	b.e = web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), DB: b.pool, ReplicaID: "replica-wh", Payments: b.svc,
		Webhooks: cfg})
	return b
}

// registered creates a session the gateway knows (Registered) and returns it.
func (b *whBench) registered(t *testing.T, order string) payments.Session {
	t.Helper()
	res, err := b.svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "t"},
		payments.CreateInput{OrderID: order, Amount: 1999, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Session.Status != payments.StatusRegistered || res.Session.GatewayPaymentID == "" {
		t.Fatalf("session %+v, want Registered with a gateway id", res.Session)
	}
	return res.Session
}

// failedDelivery delivers a "succeeded" event of a new session of order whose apply fails: the
// gateway's status call fails failures times from now (the first of them the delivery's).
func (b *whBench) failedDelivery(t *testing.T, order, eventID string, failures int) payments.Session {
	t.Helper()
	s := b.registered(t, order)
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, failures)
	if rec := b.deliverSigned(whEvent(eventID, s, s.GatewayPaymentID, "succeeded")); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"outcome":"queued"`) {
		t.Fatalf("delivery: %d %s, want 200 queued", rec.Code, rec.Body.String())
	}
	return s
}

// refgwEvent is a reference-gateway event body (gateway-api.md) for a payment in a status.
func whEvent(id string, s payments.Session, gatewayPaymentID, status string) []byte {
	body, _ := json.Marshal(map[string]any{
		"id": id, "type": "payment.updated", "created": whT0.Unix(),
		"data": map[string]any{"id": gatewayPaymentID, "status": status, "amount": s.Amount, "currency": s.Currency,
			"reference": s.Reference(), "confirmation_url": "https://fake.gateway/pay/" + gatewayPaymentID,
			"created": whT0.Unix(), "decline_code": nil},
	})
	return body
}

// whStripeEvent is a Stripe event body about a PaymentIntent in a status.
func whStripeEvent(id string, _ payments.Session, gatewayPaymentID, status string) []byte {
	return []byte(fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.%s","created":%d,
		"api_version":"2025-01-27.acacia","data":{"object":{"id":%q,"object":"payment_intent","status":%q}}}`,
		id, status, whT0.Unix(), gatewayPaymentID, status))
}

func (b *whBench) sign(body []byte) string {
	return b.scheme.sign(whSecret, b.clock.Now(), body)
}

// signed is the header map of body signed with secret at.
func (b *whBench) signed(secret string, at time.Time, body []byte) map[string]string {
	return map[string]string{b.scheme.header: b.scheme.sign(secret, at, body)}
}

func (b *whBench) deliver(body []byte, headers map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/webhooks/gateway", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	b.e.ServeHTTP(rec, req)
	return rec
}

func (b *whBench) deliverSigned(body []byte) *httptest.ResponseRecorder {
	return b.deliver(body, map[string]string{b.scheme.header: b.sign(body)})
}

func (b *whBench) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", sql, err)
	}
	return n
}

// written is what a delivery may write: inbox rows, timeline events, ledger entries, cases.
type whWritten struct{ events, timeline, ledger, cases int }

func (b *whBench) written(t *testing.T) whWritten {
	t.Helper()
	return whWritten{
		events:   b.count(t, `SELECT count(*) FROM webhook_events`),
		timeline: b.count(t, `SELECT count(*) FROM session_events`),
		ledger:   b.count(t, `SELECT count(*) FROM accounting_entries`),
		cases:    b.count(t, `SELECT count(*) FROM finance_cases`),
	}
}

func (b *whBench) status(t *testing.T, id string) payments.Status {
	t.Helper()
	s, err := b.svc.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s.Status
}

func whWantStatus(t *testing.T, rec *httptest.ResponseRecorder, want int) {
	t.Helper()
	if rec.Code != want {
		t.Fatalf("status %d, want %d; body %s", rec.Code, want, rec.Body.String())
	}
	if want >= 400 {
		if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("error Content-Type %q, want application/problem+json", ct)
		}
	}
}

// TestWebhookRefusesForgedOrStaleEventsAndWritesNothing is the receiver's contract for every
// gateway adapter: a missing or unreadable signature → 400, another secret, a changed body or a
// timestamp outside ±300 s → 401, and nothing written, nothing asked; a valid event → 200, and
// its duplicate → 200 too.
func TestWebhookRefusesForgedOrStaleEventsAndWritesNothing(t *testing.T) {
	t.Parallel()
	for _, scheme := range whSchemes {
		t.Run(scheme.name, func(t *testing.T) {
			t.Parallel()
			b := newWHBench(t, scheme)
			s := b.registered(t, "order-forged")
			b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded) // applying would complete it
			body := scheme.event("evt_forged", s, s.GatewayPaymentID, "succeeded")
			before := b.written(t)

			flipped := bytes.Clone(body)
			i := bytes.LastIndex(flipped, []byte(`"succeeded"`)) + 1
			flipped[i] ^= 0x01 // one byte of the signed body

			now := b.clock.Now()
			for _, tc := range []struct {
				name    string
				body    []byte
				headers map[string]string
				want    int
			}{
				{"no signature", body, nil, http.StatusBadRequest},
				{"malformed header", body, map[string]string{scheme.header: "v1=zz"}, http.StatusBadRequest},
				{"garbage header", body, map[string]string{scheme.header: "garbage"}, http.StatusBadRequest},
				{"another secret", body, b.signed("whsec_other", now, body), http.StatusUnauthorized},
				{"one flipped body byte", flipped, b.signed(whSecret, now, body), http.StatusUnauthorized},
				{"signed 301 s ago", body, b.signed(whSecret, now.Add(-301*time.Second), body), http.StatusUnauthorized},
				{"signed 301 s ahead", body, b.signed(whSecret, now.Add(301*time.Second), body), http.StatusUnauthorized},
			} {
				rec := b.deliver(tc.body, tc.headers)
				if rec.Code != tc.want {
					t.Errorf("%s: status %d, want %d (%s)", tc.name, rec.Code, tc.want, rec.Body.String())
				}
				if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
					t.Errorf("%s: Content-Type %q, want application/problem+json", tc.name, ct)
				}
				if got := b.written(t); got != before {
					t.Errorf("%s: wrote %+v, had %+v", tc.name, got, before)
				}
			}
			if n := b.gw.Calls(fakegw.OpStatus); n != 0 {
				t.Errorf("the gateway was asked %d times about refused events", n)
			}
			if st := b.status(t, s.ID); st != payments.StatusRegistered {
				t.Errorf("session %s after refused events, want Registered", st)
			}

			// Positive control: the same event, correctly signed 300 s ago (the edge of the
			// tolerance), is accepted and applied, so the refusals above were the signature's doing.
			whWantStatus(t, b.deliver(body, b.signed(whSecret, now.Add(-300*time.Second), body)), http.StatusOK)
			if st := b.status(t, s.ID); st != payments.StatusCompleted {
				t.Fatalf("session %s after a valid event, want Completed", st)
			}
			// A duplicate delivery: 200, nothing new.
			after := b.written(t)
			rec := b.deliverSigned(body)
			whWantStatus(t, rec, http.StatusOK)
			if !bytes.Contains(rec.Body.Bytes(), []byte(`"duplicate"`)) {
				t.Errorf("the duplicate answered %s", rec.Body.String())
			}
			if got := b.written(t); got.timeline != after.timeline || got.ledger != after.ledger || got.cases != after.cases {
				t.Errorf("the duplicate wrote %+v, had %+v", got, after)
			}
			if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt_forged' AND outcome = 'applied' AND deliveries = 2`); n != 1 {
				t.Error("the event is not recorded as applied once, delivered twice")
			}
		})
	}
}

// TestWebhookSecretRotation: with GATEWAY_WEBHOOK_SECRET holding the old and the new secret, the
// receiver applies events signed with either, and refuses (401, nothing written) one signed with
// a third; for every adapter.
func TestWebhookSecretRotation(t *testing.T) {
	t.Parallel()
	for _, scheme := range whSchemes {
		t.Run(scheme.name, func(t *testing.T) {
			t.Parallel()
			b := newWHBench(t, scheme, whSecretOld, whSecret)
			now := b.clock.Now()
			for i, secret := range []string{whSecretOld, whSecret} {
				s := b.registered(t, fmt.Sprintf("order-rotation-%d", i))
				b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
				body := scheme.event(fmt.Sprintf("evt_rotation_%d", i), s, s.GatewayPaymentID, "succeeded")
				whWantStatus(t, b.deliver(body, b.signed(secret, now, body)), http.StatusOK)
				if st := b.status(t, s.ID); st != payments.StatusCompleted {
					t.Fatalf("signed with secret %d: session %s, want Completed", i, st)
				}
			}

			s := b.registered(t, "order-rotation-third")
			b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
			body := scheme.event("evt_rotation_third", s, s.GatewayPaymentID, "succeeded")
			before := b.written(t)
			whWantStatus(t, b.deliver(body, b.signed("whsec_test_a_third_secret", now, body)), http.StatusUnauthorized)
			if got := b.written(t); got != before {
				t.Errorf("an event under a third secret wrote %+v, had %+v", got, before)
			}
			if st := b.status(t, s.ID); st != payments.StatusRegistered {
				t.Errorf("session %s after an event under a third secret, want Registered", st)
			}
		})
	}
}

// TestWebhookWithoutSecretRefusesEverything: no GATEWAY_WEBHOOK_SECRET, no verifier: every event,
// however signed, is refused with 401 and writes nothing.
func TestWebhookWithoutSecretRefusesEverything(t *testing.T) {
	t.Parallel()
	b := newWHBenchWith(t, whRefgw, handlers.WebhookConfig{})
	s := b.registered(t, "order-no-secret")
	body := whEvent("evt_no_secret", s, s.GatewayPaymentID, "succeeded")
	before := b.written(t)
	whWantStatus(t, b.deliverSigned(body), http.StatusUnauthorized)
	if got := b.written(t); got != before {
		t.Errorf("wrote %+v, had %+v", got, before)
	}
}

// TestWebhookTwentyCopiesOneEffect: the first copy is held inside its gateway call; the other 19
// arrive meanwhile and must answer 200 without asking the gateway; then the first finishes.
// One Completed event, one ledger entry, one gateway call.
func TestWebhookTwentyCopiesOneEffect(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	s := b.registered(t, "order-twenty")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	body := whEvent("evt_twenty", s, s.GatewayPaymentID, "succeeded")
	header := b.sign(body)

	gate := b.gw.Hold(fakegw.OpStatus)
	t.Cleanup(gate.Open) // a copy wrongly reaching the gateway fails the test instead of hanging it
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- b.deliver(body, map[string]string{b.scheme.header: header}) }()
	whMustWait(t, gate.Arrived(), "the first copy's gateway call")

	var wg sync.WaitGroup
	recs := make([]*httptest.ResponseRecorder, 19)
	for i := range recs {
		wg.Go(func() { recs[i] = b.deliver(body, map[string]string{b.scheme.header: header}) })
	}
	copiesDone := make(chan struct{})
	go func() { wg.Wait(); close(copiesDone) }()
	select {
	case <-copiesDone:
	case id := <-gate.Arrived():
		t.Fatalf("a copy asked the gateway (about %s) while the first was still in flight", id)
	case <-time.After(20 * time.Second):
		t.Fatal("the copies did not answer while the first was in flight")
	}
	for i, rec := range recs {
		whWantStatus(t, rec, http.StatusOK)
		if !bytes.Contains(rec.Body.Bytes(), []byte(`"duplicate"`)) {
			t.Errorf("copy %d: %s, want a duplicate", i+2, rec.Body.String())
		}
	}
	if n := b.gw.Calls(fakegw.OpStatus); n != 1 {
		t.Fatalf("gateway asked %d times while the first copy was in flight, want 1", n)
	}
	gate.Open()
	whWantStatus(t, whMustWait(t, first, "the first copy"), http.StatusOK)

	// And 20 more copies at once, after it was processed: all 200, nothing new.
	for range 20 {
		wg.Go(func() {
			if rec := b.deliver(body, map[string]string{b.scheme.header: header}); rec.Code != http.StatusOK {
				t.Errorf("late copy: %d %s", rec.Code, rec.Body.String())
			}
		})
	}
	wg.Wait()

	if n := b.count(t, `SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status = 'Completed'`, s.ID); n != 1 {
		t.Errorf("%d Completed events, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, s.ID); n != 1 {
		t.Errorf("%d ledger entries, want 1", n)
	}
	if n := b.gw.Calls(fakegw.OpStatus); n != 1 {
		t.Errorf("gateway asked %d times for 40 copies of one event, want 1", n)
	}
	var deliveries int
	var outcome string
	if err := b.pool.QueryRow(context.Background(), `SELECT deliveries, outcome FROM webhook_events WHERE event_id = 'evt_twenty'`).
		Scan(&deliveries, &outcome); err != nil {
		t.Fatal(err)
	}
	if deliveries != 40 || outcome != "applied" {
		t.Errorf("inbox row: %d deliveries, outcome %q; want 40, applied", deliveries, outcome)
	}
}

// TestWebhookClaimOfADeadDeliveryIsTakenOver: a delivery that never finishes (its replica died)
// holds the event only until its claim expires; the gateway's next redelivery then applies it.
// This is also the negative control of the test above: a copy that does take the claim does ask
// the gateway, and one effect still results.
func TestWebhookClaimOfADeadDeliveryIsTakenOver(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	s := b.registered(t, "order-takeover")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	body := whEvent("evt_takeover", s, s.GatewayPaymentID, "succeeded")

	gate := b.gw.Hold(fakegw.OpStatus)
	t.Cleanup(gate.Open)
	stuck := make(chan *httptest.ResponseRecorder, 1)
	go func() { stuck <- b.deliverSigned(body) }()
	whMustWait(t, gate.Arrived(), "the stuck delivery's gateway call")

	whWantStatus(t, b.deliverSigned(body), http.StatusOK) // claimed: a duplicate, no call
	if n := b.gw.Calls(fakegw.OpStatus); n != 1 {
		t.Fatalf("gateway asked %d times, want 1", n)
	}

	b.clock.Advance(payments.LeaseFor(0) + time.Second) // the claim: the patrol's lease at the default GATEWAY_TIMEOUT
	second := make(chan *httptest.ResponseRecorder, 1)
	go func() { second <- b.deliverSigned(body) }()
	whMustWait(t, gate.Arrived(), "the redelivery's gateway call (it took the expired claim over)")
	gate.Open()
	whWantStatus(t, whMustWait(t, second, "the redelivery"), http.StatusOK)
	whWantStatus(t, whMustWait(t, stuck, "the stuck delivery"), http.StatusOK)

	if st := b.status(t, s.ID); st != payments.StatusCompleted {
		t.Fatalf("session %s, want Completed", st)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, s.ID); n != 1 {
		t.Errorf("%d ledger entries, want 1", n)
	}
}

func TestWebhookLateAuthorizedAfterSucceededStaysCompleted(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	s := b.registered(t, "order-late-auth")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)

	whWantStatus(t, b.deliverSigned(whEvent("evt_2_succeeded", s, s.GatewayPaymentID, "succeeded")), http.StatusOK)
	if st := b.status(t, s.ID); st != payments.StatusCompleted {
		t.Fatalf("after succeeded: %s, want Completed", st)
	}
	// The older event arrives last: the gateway is asked again and still says succeeded.
	whWantStatus(t, b.deliverSigned(whEvent("evt_1_authorized", s, s.GatewayPaymentID, "authorized")), http.StatusOK)
	if st := b.status(t, s.ID); st != payments.StatusCompleted {
		t.Fatalf("after a late authorized: %s, want Completed", st)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, s.ID); n != 1 {
		t.Errorf("%d ledger entries, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM session_events WHERE session_id = $1 AND to_status IN ('Authorized', 'Completed')`, s.ID); n != 1 {
		t.Errorf("%d Authorized/Completed events, want just the one Completed", n)
	}
	if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE processed_at IS NOT NULL AND outcome = 'applied'`); n != 2 {
		t.Errorf("%d events processed, want 2", n)
	}
}

var whSixDigits = regexp.MustCompile(`\b\d{6}\b`)

func TestWebhookSuccessForCanceledSessionOpensLatePaymentCase(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	s := b.registered(t, "order-late-pay")
	ctx := context.Background()
	staff := payments.Actor{Kind: payments.ActorStaff, ID: "support@example.com"}
	ch, err := b.svc.RequestCancel(ctx, staff, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	var text string
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1 AND kind = 'cancel_code'`, s.ID).Scan(&text); err != nil {
		t.Fatal(err)
	}
	res, err := b.svc.ConfirmCancel(ctx, staff, s.ID, ch.ID, whSixDigits.FindString(text))
	if err != nil {
		t.Fatal(err)
	}
	if res.Session.Status != payments.StatusCanceled {
		t.Fatalf("after cancel: %s, want Canceled", res.Session.Status)
	}

	// The gateway captures anyway (a late payment) and says so.
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	whWantStatus(t, b.deliverSigned(whEvent("evt_late", s, s.GatewayPaymentID, "succeeded")), http.StatusOK)

	if st := b.status(t, s.ID); st != payments.StatusCanceled {
		t.Errorf("session %s, want it to stay Canceled", st)
	}
	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'late_payment' AND resolved_at IS NULL`, s.ID); n != 1 {
		t.Errorf("%d open late_payment cases, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries`); n != 0 {
		t.Errorf("%d ledger entries, want none", n)
	}
	if n := b.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'Paid'`, s.OrderID); n != 0 {
		t.Error("the order became Paid")
	}
}

func TestWebhookUnknownPaymentIsRecordedAndAcknowledged(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	ghost := payments.Session{ID: uuid.NewString(), Amount: 500, Currency: "EUR"}
	rec := b.deliverSigned(whEvent("evt_ghost", ghost, "gp_nobody", "succeeded"))
	whWantStatus(t, rec, http.StatusOK)
	if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt_ghost' AND outcome = 'unknown_payment'
		AND processed_at IS NOT NULL AND gateway_payment_id = 'gp_nobody' AND reference = $1`, ghost.ID); n != 1 {
		t.Fatalf("unknown payment not recorded as such; body %s", rec.Body.String())
	}
	if w := b.written(t); w.timeline != 0 || w.ledger != 0 || w.cases != 0 {
		t.Errorf("an unknown payment wrote %+v", w)
	}
	// Redelivered: a duplicate, still 200.
	whWantStatus(t, b.deliverSigned(whEvent("evt_ghost", ghost, "gp_nobody", "succeeded")), http.StatusOK)
}

// A correctly signed event whose id or payment id was longer than about 2,700 bytes answered
// 500: PostgreSQL refused the inbox row (SQLSTATE 54000, "index row size exceeds btree
// maximum", on webhook_events' unique (gateway, event_id) and its (gateway, gateway_payment_id)
// index), and the gateway delivered it again for days. Outside review (webhooks); the same class
// as the NUL byte in TestUnstorableBytesInTheAPIAndWebhooksAreClientErrors. Such an id is longer
// than any gateway's (payments.MaxGatewayIDLen, 255 bytes: Stripe's documented bound), so the
// event is refused like any unreadable one — 400 problem+json, nothing written, the gateway asked
// nothing — for every adapter. Negative control: without the bound in HandleGatewayEvent the
// 3,000-byte ids answer 500 and the 256-byte ones 200. Positive control: ids of exactly 255
// bytes are recorded and applied.
func TestWebhookIDsLongerThanAnyGatewaysAreRefusedWithNothingWritten(t *testing.T) {
	t.Parallel()
	for _, scheme := range whSchemes {
		t.Run(scheme.name, func(t *testing.T) {
			t.Parallel()
			b := newWHBench(t, scheme)
			s := b.registered(t, "order-long-ids")
			b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded) // applying would complete it
			before := b.written(t)
			for _, tc := range []struct {
				name   string
				body   []byte
				detail string
			}{
				{"event id of 256 bytes", scheme.event(whOpaqueID("evt_", 256), s, s.GatewayPaymentID, "succeeded"), "event id has 256 bytes"},
				{"event id of 3,000 bytes", scheme.event(whOpaqueID("evt_", 3000), s, s.GatewayPaymentID, "succeeded"), "event id has 3000 bytes"},
				{"payment id of 256 bytes", scheme.event("evt_pay_256", s, whOpaqueID("gp_", 256), "succeeded"), "payment id has 256 bytes"},
				{"payment id of 3,000 bytes", scheme.event("evt_pay_3000", s, whOpaqueID("gp_", 3000), "succeeded"), "payment id has 3000 bytes"},
			} {
				rec := b.deliverSigned(tc.body)
				if rec.Code != http.StatusBadRequest || rec.Header().Get("Content-Type") != "application/problem+json" ||
					!strings.Contains(rec.Body.String(), tc.detail) {
					t.Errorf("%s: %d %s %s, want a 400 problem naming %q (a 5xx is redelivered for days)",
						tc.name, rec.Code, rec.Header().Get("Content-Type"), rec.Body.String(), tc.detail)
				}
				if got := b.written(t); got != before {
					t.Errorf("%s: wrote %+v, had %+v", tc.name, got, before)
				}
			}
			if n := b.gw.Calls(fakegw.OpStatus); n != 0 {
				t.Errorf("the gateway was asked %d times about refused events", n)
			}
			if st := b.status(t, s.ID); st != payments.StatusRegistered {
				t.Fatalf("session %s after refused events, want Registered", st)
			}

			// Positive control: 255 bytes, the bound itself, fit the inbox's indexes and are
			// handled as any event: applied, and recorded about a payment no session knows.
			whWantStatus(t, b.deliverSigned(scheme.event(whOpaqueID("evt_", 255), s, s.GatewayPaymentID, "succeeded")), http.StatusOK)
			if st := b.status(t, s.ID); st != payments.StatusCompleted {
				t.Fatalf("session %s after an event id of 255 bytes, want Completed", st)
			}
			whWantStatus(t, b.deliverSigned(scheme.event("evt_pay_255", s, whOpaqueID("gp_", 255), "succeeded")), http.StatusOK)
			if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE octet_length(event_id) = 255 OR octet_length(gateway_payment_id) = 255`); n != 2 {
				t.Fatalf("%d events with 255-byte ids recorded, want 2", n)
			}
		})
	}
}

// whOpaqueID is an id of n bytes that PostgreSQL cannot compress (a btree entry is compressed
// before its size is checked, so "x" × 3,000 would fit): hex of a hash chain, deterministic.
func whOpaqueID(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(prefix)
	for i := 0; b.Len() < n; i++ {
		sum := sha256.Sum256([]byte(fmt.Sprint(prefix, i)))
		b.WriteString(hex.EncodeToString(sum[:]))
	}
	return b.String()[:n]
}

// TestWebhookNotMarkedProcessedWhenTheGatewayIsDown: the hint cannot be applied (the gateway
// does not answer). The event is valid and recorded, so the receiver answers 200 (the contract:
// "a valid event → 200"; outcome "queued") and leaves the event unprocessed with its error and
// the patrol's retry time; a redelivery, if one comes, applies it.
func TestWebhookNotMarkedProcessedWhenTheGatewayIsDown(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	s := b.registered(t, "order-gw-down")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	body := whEvent("evt_down", s, s.GatewayPaymentID, "succeeded")

	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	rec := b.deliverSigned(body)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"outcome":"queued"`) {
		t.Fatalf("status %d %s while the gateway is down, want 200 queued: the event is recorded and the patrol retries it", rec.Code, rec.Body.String())
	}
	var processed, retry bool
	var errText string
	if err := b.pool.QueryRow(context.Background(), `SELECT processed_at IS NOT NULL, coalesce(error, ''), retry_at IS NOT NULL FROM webhook_events WHERE event_id = 'evt_down'`).
		Scan(&processed, &errText, &retry); err != nil {
		t.Fatal(err)
	}
	if processed || errText == "" || !retry {
		t.Fatalf("after a failed apply: processed=%v error=%q retry=%v, want unprocessed with the error and a retry time", processed, errText, retry)
	}
	if st := b.status(t, s.ID); st != payments.StatusRegistered {
		t.Fatalf("session %s, want unchanged", st)
	}

	whWantStatus(t, b.deliverSigned(body), http.StatusOK) // the redelivery
	if st := b.status(t, s.ID); st != payments.StatusCompleted {
		t.Fatalf("after the redelivery: %s, want Completed", st)
	}
	if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt_down' AND processed_at IS NOT NULL AND error IS NULL AND deliveries = 2`); n != 1 {
		t.Error("the redelivered event is not marked processed")
	}
}

// A copy of an event that arrives while the first delivery is still applying it is acknowledged
// (200: a duplicate, for the contract), and the first delivery then fails (audit 5, F2). A
// gateway that counts the copy's 200 as the event delivered never sends it again: the patrol
// retries the event on the looks' schedule and applies it. A retry never takes an event a live
// delivery holds, and waits for its time.
func TestWebhookFailedWhileACopyWasAcknowledgedIsRetriedByThePatrol(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newWHBench(t, whRefgw)
	s := b.registered(t, "order-copy")
	b.gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
	body := whEvent("evt_copy", s, s.GatewayPaymentID, "succeeded")

	gate := b.gw.Hold(fakegw.OpStatus)
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- b.deliverSigned(body) }()
	<-gate.Arrived() // the first delivery holds the event and waits for the gateway
	whWantStatus(t, b.deliverSigned(body), http.StatusOK)
	if n, err := b.svc.RetryWebhooksOnce(ctx); err != nil || n != 0 {
		t.Fatalf("retry while a delivery holds the event = %d %v, want 0", n, err)
	}
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	b.gw.Unhold(fakegw.OpStatus)
	gate.Release()
	if rec := <-first; rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"outcome":"queued"`) {
		t.Fatalf("first delivery: %d %s, want 200 queued (its apply failed; the patrol retries it)", rec.Code, rec.Body.String())
	}
	if st := b.status(t, s.ID); st != payments.StatusRegistered {
		t.Fatalf("session %s after the failed apply, want Registered", st)
	}

	// No delivery comes again. Before its time the patrol leaves the event; then applies it.
	b.clock.Advance(payments.DefaultBackoff[0] - time.Second)
	if n, err := b.svc.RetryWebhooksOnce(ctx); err != nil || n != 0 {
		t.Fatalf("retry before its time = %d %v, want 0", n, err)
	}
	b.clock.Advance(time.Second)
	if n, err := b.svc.RetryWebhooksOnce(ctx); err != nil || n != 1 {
		t.Fatalf("retry = %d %v, want 1", n, err)
	}
	if st := b.status(t, s.ID); st != payments.StatusCompleted {
		t.Fatalf("session %s after the retry, want Completed", st)
	}
	if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt_copy' AND processed_at IS NOT NULL
		AND outcome = 'applied' AND error IS NULL AND deliveries = 2 AND attempts = 1`); n != 1 {
		t.Fatal("the retried event is not marked processed after one failed attempt and two deliveries")
	}
	if n := b.count(t, `SELECT count(*) FROM accounting_entries WHERE session_id = $1`, s.ID); n != 1 {
		t.Fatalf("ledger entries = %d, want 1", n)
	}
	if n, err := b.svc.RetryWebhooksOnce(ctx); err != nil || n != 0 {
		t.Fatalf("retry of a processed event = %d %v, want 0", n, err)
	}
}

// A retry that fails again waits for the next step of the schedule.
func TestWebhookRetryFollowsTheSchedule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newWHBench(t, whRefgw)
	s := b.failedDelivery(t, "order-retry-again", "evt_again", 2)
	b.clock.Advance(payments.DefaultBackoff[0])
	if n, err := b.svc.RetryWebhooksOnce(ctx); err != nil || n != 1 {
		t.Fatalf("first retry = %d %v, want 1 (failing)", n, err)
	}
	b.clock.Advance(payments.DefaultBackoff[1] - time.Second)
	if n, err := b.svc.RetryWebhooksOnce(ctx); err != nil || n != 0 {
		t.Fatalf("retry before the schedule's second step = %d %v, want 0", n, err)
	}
	b.clock.Advance(time.Second)
	if n, err := b.svc.RetryWebhooksOnce(ctx); err != nil || n != 1 {
		t.Fatalf("second retry = %d %v, want 1", n, err)
	}
	if st := b.status(t, s.ID); st != payments.StatusCompleted {
		t.Fatalf("session %s, want Completed", st)
	}
	if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt_again' AND processed_at IS NOT NULL AND attempts = 2`); n != 1 {
		t.Fatal("want the event processed after two failed attempts")
	}
}

// The replica's patrol (PatrolRound, what `pitlane serve` runs) retries failed events along with
// sessions and refunds: the event is marked processed by the patrol, not only the session settled.
func TestWebhookRetryIsPartOfThePatrol(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	s := b.failedDelivery(t, "order-patrol-retry", "evt_patrol", 1)
	b.clock.Advance(payments.DefaultBackoff[0])
	if _, err := b.svc.PatrolRound(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt_patrol' AND processed_at IS NOT NULL AND attempts = 1`); n != 1 {
		t.Fatal("the patrol round did not apply the failed event")
	}
	if st := b.status(t, s.ID); st != payments.StatusCompleted {
		t.Fatalf("session %s, want Completed", st)
	}
}

// After a long outage the retries' wait stops growing at five minutes: an event that failed for
// a day is applied within minutes of the gateway's return, not on the looks' daily step.
func TestWebhookRetryWaitIsCapped(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	s := b.registered(t, "order-retry-capped")
	if rec := b.deliverSigned(whEvent("evt_capped", s, s.GatewayPaymentID, "succeeded")); rec.Code != http.StatusOK {
		t.Fatalf("delivery: %d", rec.Code)
	}
	// The event failed many times already (attempts far along the schedule), then once more.
	if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_events SET processed_at = NULL, attempts = 14, retry_at = $1
		WHERE event_id = 'evt_capped'`, b.clock.Now()); err != nil {
		t.Fatal(err)
	}
	b.gw.Fail(fakegw.OpStatus, fakegw.Transient, 1)
	if n, err := b.svc.RetryWebhooksOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("retry = %d %v, want 1 (failing)", n, err)
	}
	var wait time.Duration
	if err := b.pool.QueryRow(context.Background(), `SELECT (extract(epoch FROM retry_at - $1) * 1e9)::bigint FROM webhook_events WHERE event_id = 'evt_capped'`,
		b.clock.Now()).Scan(&wait); err != nil {
		t.Fatal(err)
	}
	if wait != 5*time.Minute {
		t.Fatalf("next retry in %s, want 5m (the cap, not the schedule's hours)", wait)
	}
}

// TestWebhookSecondGatewayPaymentOfASessionOpensCase: a gateway that ignored our idempotency key
// holds two payments with one session's reference; an event about the other one is a finance case
// (the customer may pay twice), not something to attach or ignore silently.
func TestWebhookSecondGatewayPaymentOfASessionOpensCase(t *testing.T) {
	t.Parallel()
	b := newWHBench(t, whRefgw)
	s := b.registered(t, "order-dup")
	b.gw.IgnoreKeys(true)
	dup, err := b.gw.Register(context.Background(), payments.RegisterRequest{IdempotencyKey: s.ID, Reference: s.Reference(),
		Amount: s.Amount, Currency: s.Currency})
	if err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(dup.ID, payments.GatewaySucceeded)
	whWantStatus(t, b.deliverSigned(whEvent("evt_dup", s, dup.ID, "succeeded")), http.StatusOK)

	if n := b.count(t, `SELECT count(*) FROM finance_cases WHERE session_id = $1 AND kind = 'duplicate_gateway_payment'`, s.ID); n != 1 {
		t.Errorf("%d duplicate-payment cases, want 1", n)
	}
	if st := b.status(t, s.ID); st != payments.StatusRegistered {
		t.Errorf("session %s: its own payment is still pending, want Registered", st)
	}
}

func whMustWait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}
