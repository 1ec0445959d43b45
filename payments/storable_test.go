package payments_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
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
