package payments_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// nulNameServer is an https endpoint whose (self-signed) certificate names a host with a NUL
// byte in it: whoever answers at a webhook URL's host (EVENTS_WEBHOOK_URL, NOTIFY_WEBHOOK_URL: a squatted or mistyped domain, a
// hostile receiver) chooses it. Go's TLS client refuses the certificate before it checks the
// chain and quotes the certificate's names in the error, NUL included.
func nulNameServer(t *testing.T) *httptest.Server {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shop"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"shop\x00.example"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// A failed POST is counted (attempts, the wait before the next, last_error): that is what the
// Operations card's "failing", pitlane_events_webhook_failures and PitlaneEventsWebhookFailing
// read. When the failure's text carried a NUL byte chosen by the endpoint, PostgreSQL refused
// the failure's UPDATE (text cannot hold 0x00): nothing was counted, the row stayed leased until
// its lease ran out, and the POSTs went on every lease (20 s) with no backoff and no "failing"
// anywhere (an outside review, events webhook).
func TestAnEventsWebhookFailureWithANulInItsTextIsCounted(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	srv := nulNameServer(t)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	url := "https://localhost:" + port + "/events"
	svc := b.service(b.pool, "replica-a", func(c *payments.Config) {
		c.EventsWebhook = payments.EventsWebhook{URL: url, Secrets: [][]byte{shopSecret}}
	})
	push(t, svc) // delivery begins
	b.registered(t, "o-nul-cert", 900)
	feedReady(t, b, 2)
	_, err := svc.PushEvents(context.Background())
	if err != nil {
		t.Errorf("the round failed to record its failed POST: %v", err)
	}
	st := webhookStatus(t, svc)
	if st.Failures != 1 || st.NextAttemptAt == nil || !strings.Contains(st.LastError, "x509") || st.LeaseOwner != "" {
		t.Fatalf("after a POST refused by TLS: %d failures, next attempt %v, last error %q, lease owner %q; want 1 failure counted, a wait, the row given back",
			st.Failures, st.NextAttemptAt, st.LastError, st.LeaseOwner)
	}
}

// The same for a one-time code's message: a notifier whose failure text carried a NUL was never
// counted, so the message never reached its attempt cap, its backoff or its alert.
func TestANotifierFailureWithANulInItsTextIsCounted(t *testing.T) {
	t.Parallel()
	srv := nulNameServer(t)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	b := newBench(t, func(c *payments.Config) {
		c.Notifier = payments.WebhookNotifier{URL: "https://localhost:" + port + "/notify"}
	})
	sess := b.registered(t, "o-nul-notify", 100)
	if _, err := b.svc.RequestCancel(context.Background(), api, sess.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE attempts = 1 AND delivered_at IS NULL AND lease_until IS NULL
		AND next_attempt_at IS NOT NULL AND last_error LIKE '%x509%'`); n != 1 {
		t.Fatalf("the code's message after a POST refused by TLS: %d counted as failed once, want 1", n)
	}
}

// nulRefusal is a gateway whose refund answer is a 4xx whose error code carries a NUL: refgw reads
// {"error":"not\u0000refundable"} so (TestUnusableAnswers keeps the code as the gateway's word).
type nulRefusal struct{ payments.Gateway }

func (nulRefusal) Refund(context.Context, string, string, int64, string) (payments.GatewayRefund, error) {
	return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: "refund", HTTPStatus: 422,
		Code: "not\x00refundable"}
}

// A refund the gateway refused with a code carrying a NUL is settled Failed with detail "the
// gateway refused: "+code: the UPDATE was refused by PostgreSQL (text holds no NUL), the refund
// stayed Pending holding the payment's refund room, and every drive after did the same (a
// review of f9dd848: GatewayErrorCode is storable too).
func TestARefundRefusedWithANulInItsCodeIsSettled(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule, func(c *payments.Config) { c.Gateway = nulRefusal{c.Gateway} })
	ctx := context.Background()
	s := b.completed(t, "o-nul-refusal", 1000)
	r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 300, RequestKey: "k1"})
	if err != nil || r.Refund.Status != payments.RefundFailed {
		t.Fatalf("a refund the gateway refused = %+v, %v; want it Failed (the gateway refused)", r.Refund, err)
	}
}

// nulReverse refuses every reverse with a code carrying a NUL (refgw: 409 {"error":"not\u0000reversible"}).
type nulReverse struct{ payments.Gateway }

func (nulReverse) Reverse(context.Context, string, string) (payments.GatewayPayment, error) {
	return payments.GatewayPayment{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: "reverse", HTTPStatus: 409,
		Code: "not\x00reversible"}
}

// A confirmed cancel whose reverse the gateway refuses (its code carrying a NUL) while the
// payment was declined ends Failed: the apply's reason "reverse refused: "+code was refused by
// PostgreSQL, the session stayed Canceling, and the patrol repeated it for ever (the same review).
func TestAReverseRefusedWithANulInItsCodeEndsTheCancel(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(c *payments.Config) { c.Gateway = nulReverse{c.Gateway} })
	ctx := context.Background()
	sess := b.registered(t, "o-nul-reverse", 1000)
	b.gw.SetStatus(sess.GatewayPaymentID, payments.GatewayDeclined)
	ch, err := b.svc.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.svc.ConfirmCancel(ctx, api, sess.ID, ch.ID, b.lastCode(t, sess.ID))
	got, _ := b.svc.Get(ctx, sess.ID)
	if got.Status != payments.StatusFailed {
		t.Fatalf("a cancel whose reverse was refused for a declined payment: confirm = %s %v, stored %s; want Failed (nothing to reverse)",
			res.Session.Status, err, got.Status)
	}
}

// garbledIDs is a gateway whose answers name ids a column cannot hold: with a NUL (as the Stripe
// adapter handed Stripe's answers on; refgw read them as unreadable) or longer than a btree
// entry (any adapter: only the webhook receiver bounded ids).
type garbledIDs struct {
	payments.Gateway
	garble func(string) string
}

func (g garbledIDs) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	p, err := g.Gateway.Register(ctx, req)
	p.ID = g.garble(p.ID)
	return p, err
}

func (g garbledIDs) Refund(ctx context.Context, id, key string, amount int64, currency string) (payments.GatewayRefund, error) {
	r, err := g.Gateway.Refund(ctx, id, key, amount, currency)
	r.ID = g.garble(r.ID)
	return r, err
}

// A registration or refund answer the core could not store is unreadable, whatever the adapter:
// unknown, answered as not confirmed yet and asked again. Before, a NUL in a Stripe answer's id
// made Create answer the shop 400 "the request holds characters that cannot be stored" for a
// payment the gateway held, and an 8,000-byte id failed the attach on its index with a 500 (an
// outside review, hostile text).
func TestAGatewayAnswerNoColumnHoldsIsUnreadable(t *testing.T) {
	t.Parallel()
	for name, garble := range map[string]func(string) string{
		"a NUL":           func(id string) string { return id + "\x00" },
		"8,000 bytes":     func(id string) string { return id + strings.Repeat("x", 8000) },
		"invalid UTF-8":   func(id string) string { return id + "\xff" },
		"256 bytes (255)": func(id string) string { return id + strings.Repeat("x", 256-len(id)) },
		// Shows as another id on the page (the rest of a case's line turned around): a review.
		"a right-to-left override": func(id string) string { return id + "\u202e" },
		"a zero-width space":       func(id string) string { return id + "\u200b" },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t, func(c *payments.Config) { c.Gateway = garbledIDs{Gateway: c.Gateway, garble: garble} })
			ctx := context.Background()
			r, err := b.svc.Create(ctx, api, payments.CreateInput{OrderID: "o-garbled", Amount: 100, Currency: "EUR"})
			if err != nil || r.Session.Status != payments.StatusUnknown || r.Session.GatewayPaymentID != "" {
				t.Fatalf("create whose register answer named %s: %+v %s %v; want Unknown, nothing attached", name, r.Session, payments.ErrorCode(err), err)
			}
			paid := b.completed(t, "o-garbled-paid", 1000)
			rf, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: paid.ID, Amount: 100, RequestKey: "k"})
			if err != nil || rf.Refund.Status != payments.RefundPending || rf.Refund.GatewayRefundID != "" || b.gw.Calls(fakegw.OpRefund) != 1 {
				t.Fatalf("a refund answered with %s: %+v %v (refund calls %d); want Pending, nothing attached", name, rf.Refund, err, b.gw.Calls(fakegw.OpRefund))
			}
		})
	}
}

// bidiRefusal refuses every refund with an error whose code and message carry a right-to-left
// override: text the gateway chooses, stored in the refund's detail and the call log, which staff
// read on the payment's page.
type bidiRefusal struct{ payments.Gateway }

func (bidiRefusal) Refund(context.Context, string, string, int64, string) (payments.GatewayRefund, error) {
	return payments.GatewayRefund{}, &payments.GatewayError{Kind: payments.FailureDefinitive, Op: "refund", HTTPStatus: 422,
		Code: "not_refundable\u202e)RUE 001 ,dedeeccus(", Err: errors.New("card\u200bclosed")}
}

// A gateway's error text is shown to staff (a refund's detail, the call log): a right-to-left
// override in it turned the rest of the line around on the page, "(succeeded, 100 EUR)" showing
// as words the gateway never sent in that order (an outside review, console). Each character
// that does not show as itself is stored as its code point. Negative control (run by hand):
// storable without it, the override stored as it came.
func TestAGatewaysInvisibleCharactersAreStoredVisibly(t *testing.T) {
	t.Parallel()
	b := newBench(t, shortSchedule, func(c *payments.Config) { c.Gateway = bidiRefusal{c.Gateway} })
	ctx := context.Background()
	s := b.completed(t, "o-bidi-refusal", 1000)
	r, err := b.svc.CreateRefund(ctx, api, payments.RefundInput{PaymentID: s.ID, Amount: 300, RequestKey: "k1"})
	if err != nil || r.Refund.Status != payments.RefundFailed {
		t.Fatalf("a refund the gateway refused = %+v, %v; want it Failed (the gateway refused)", r.Refund, err)
	}
	if !strings.Contains(r.Refund.Detail, "<U+202E>") || strings.ContainsRune(r.Refund.Detail, '\u202e') {
		t.Errorf("the refund's detail = %q, want the override written as <U+202E>", r.Refund.Detail)
	}
	for _, d := range b.texts(t, `SELECT detail FROM gateway_calls WHERE session_id = $1`, s.ID) {
		if strings.ContainsAny(d, "\u202e\u200b") {
			t.Errorf("a call's log holds an invisible character: %q", d)
		}
	}
}

// A signed webhook's ids are the gateway's text as much as its answers are, and reached a
// finance case's detail (a second payment the gateway does not know) with a right-to-left
// override that turned the line around on staff pages (a review of the answers' check). A case's
// detail shows such characters as their code points. Refusing the event instead refused another
// shop's (a shared gateway account) whose reference holds an emoji's zero-width joiner, and the
// gateway redelivered it for days (a review of that): such an event is acknowledged. Negative
// controls (run by hand): without storable in newsOf, the override in the case; refusing, the
// other shop's event malformed.
func TestAWebhooksInvisibleCharactersAreShownVisibly(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	s := b.completed(t, "o-bidi-webhook", 1000)
	if _, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_1", Type: "payment.updated",
		PaymentID: "gp_evil\u202e)RUE 00.01 ,dedeeccus(", Reference: s.ID}); err != nil {
		t.Fatalf("an event of an unknown payment under the session's reference: %v", err)
	}
	details := b.texts(t, `SELECT detail FROM finance_cases WHERE session_id = $1`, s.ID)
	if len(details) != 1 || strings.ContainsRune(details[0], '\u202e') || !strings.Contains(details[0], "<U+202E>") {
		t.Errorf("the case's detail = %q, want one with the override written as <U+202E>", details)
	}
	other := payments.GatewayEvent{ID: "evt_2", Type: "payment.updated", PaymentID: "gp_other_shop",
		Reference: "Bestellung 42 \U0001f469\u200d\U0001f4bb \u00ad\t"}
	if res, err := b.svc.HandleGatewayEvent(ctx, other); err != nil || res.Outcome != payments.EventUnknownPayment {
		t.Errorf("another shop's event with an emoji in its reference = %v %v, want it acknowledged as an unknown payment", res, err)
	}
}

// Another shop's event on a shared gateway account that carries no reference (Stripe's do not):
// the gateway is asked for its payment, whose reference holds an emoji's zero-width joiner. The
// answer was refused as unreadable, and the event was asked about every few minutes for ever (a
// review). A reference is not shown text (ours are session ids); it is acknowledged as another's
// payment. Negative control (run by hand): the reference among the shown, the event queued.
func TestAnotherShopsEventWhosePaymentsReferenceHasAnEmojiIsAcknowledged(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	gp, err := b.gw.Register(ctx, payments.RegisterRequest{Amount: 700, Currency: "EUR",
		Reference: "Bestellung 42 \U0001f469\u200d\U0001f4bb", IdempotencyKey: "other-shop-42"})
	if err != nil {
		t.Fatal(err)
	}
	b.gw.SetStatus(gp.ID, payments.GatewaySucceeded)
	res, err := b.svc.HandleGatewayEvent(ctx, payments.GatewayEvent{ID: "evt_other_42", Type: "payment.updated", PaymentID: gp.ID})
	if err != nil || res.Outcome != payments.EventUnknownPayment {
		t.Errorf("another shop's event (no reference; its payment's reference holds a ZWJ) = %v %v, want it acknowledged as an unknown payment", res.Outcome, err)
	}
	if n := b.count(t, `SELECT count(*) FROM webhook_events WHERE processed_at IS NULL`); n != 0 {
		t.Errorf("%d events left for the patrol to ask about again", n)
	}
}
