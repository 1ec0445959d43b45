package stripegw

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pitlane/payments"
)

// TestStripeRefusesRedirects: a 307 answering the refund's POST (an egress proxy, a wrong
// GATEWAY_URL, a hostile host there) is not followed. Go's default client followed it and re-sent
// the POST — body, Idempotency-Key and, to any port of the same host name, the secret key — to
// wherever Location pointed, over plain http too, then applied that answer as Stripe's (an
// outside review, stripe2). As refgw: nothing reaches the redirect's target; the answer is
// unknown (retried with the same key, or looked up).
func TestStripeRefusesRedirects(t *testing.T) {
	const secretKey = "sk_test_auditRedirectSecret"
	var (
		reached atomic.Int32
		mu      sync.Mutex
		auth    []string
	)
	// Another origin (another port, plain http): it should never see our requests.
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		auth = append(auth, r.Method+" "+r.URL.Path+" Authorization="+r.Header.Get("Authorization")+" Idempotency-Key="+r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"re_elsewhere","object":"refund","amount":500,"currency":"eur","payment_intent":"pi_1","status":"succeeded"}`)
	}))
	t.Cleanup(elsewhere.Close)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(api.Close)

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	g, err := New(Options{SecretKey: secretKey, BaseURL: api.URL, Timeout: 2 * time.Second, HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	_, rerr := g.Refund(context.Background(), "pi_1", "rf_audit_key", 500, "EUR")
	mu.Lock()
	defer mu.Unlock()
	if n := reached.Load(); n != 0 {
		t.Errorf("the redirect was followed: %d request(s) reached another origin (%s): %s", n, elsewhere.URL, strings.Join(auth, "; "))
		for _, a := range auth {
			if strings.Contains(a, secretKey) {
				t.Errorf("the Stripe secret key went to %s in clear: %s", elsewhere.URL, a)
			}
		}
	}
	if payments.FailureOf(rerr) != payments.FailureUnknown {
		t.Errorf("Refund answered by a redirect = %v (kind %q), want an unknown failure as refgw gives", rerr, payments.FailureOf(rerr))
	}
}
