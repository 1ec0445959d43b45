package payments_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"testing"

	"pitlane/payments"
)

// The contract's notification sink: with NOTIFY_WEBHOOK_URL set, a cancel code is POSTed as
// {"to","kind","text","order_id","payment_id"} before RequestCancel returns, and the outbox
// row is marked delivered. A sink answering 500 leaves it undelivered for the patrol.
func TestWebhookNotifierDeliversCancelCode(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []map[string]any
	fail := false
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("sink got %s %s", r.Method, r.Header.Get("Content-Type"))
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Errorf("sink body %q: %v", body, err)
		}
		got = append(got, m)
		if fail {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer sink.Close()
	b := newBench(t, func(c *payments.Config) { c.Notifier = payments.WebhookNotifier{URL: sink.URL} })
	ctx := context.Background()
	sess := b.registered(t, "o-notify", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(got) != 1 {
		mu.Unlock()
		t.Fatalf("sink received %d messages", len(got))
	}
	m := got[0]
	fail = true
	mu.Unlock()
	for _, k := range []string{"to", "kind", "text", "order_id", "payment_id"} {
		if _, ok := m[k]; !ok {
			t.Errorf("message lacks %q: %v", k, m)
		}
	}
	if m["to"] != "buyer@example.com" || m["kind"] != "cancel_code" || m["order_id"] != "o-notify" || m["payment_id"] != sess.ID {
		t.Errorf("message = %v", m)
	}
	if !regexp.MustCompile(`\b\d{6}\b`).MatchString(m["text"].(string)) {
		t.Errorf("no 6-digit code in %q", m["text"])
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`); n != 1 {
		t.Fatalf("delivered rows = %d", n)
	}
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND last_error IS NOT NULL`); n != 1 {
		t.Fatalf("a refused delivery must stay undelivered with its error (%d)", n)
	}
}
