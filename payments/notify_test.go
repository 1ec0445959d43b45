package payments_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

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

// A cancel code stays in the outbox only until it is delivered (the contract: never stored in
// clear after delivery): kept while the sink refuses it, so the patrol can send it again, and
// replaced by "[redacted]" in the row once the sink took it. The message itself is untouched.
func TestDeliveredCodeLeavesTheOutbox(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var texts []string
	fail := true
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m payments.Message
		_ = json.NewDecoder(r.Body).Decode(&m)
		mu.Lock()
		defer mu.Unlock()
		texts = append(texts, m.Text)
		if fail {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer sink.Close()
	b := newBench(t, func(c *payments.Config) { c.Notifier = payments.WebhookNotifier{URL: sink.URL} })
	ctx := context.Background()
	sess := b.registered(t, "o-redact", 100)
	if _, err := b.svc.RequestCancel(ctx, api, sess.ID); err != nil {
		t.Fatal(err)
	}
	body := func() string {
		var s string
		if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE payment_id = $1`, sess.ID).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	mu.Lock()
	code := regexp.MustCompile(`\b\d{6}\b`).FindString(texts[0])
	fail = false
	mu.Unlock()
	if code == "" || !regexp.MustCompile(`\b`+code+`\b`).MatchString(body()) {
		t.Fatalf("an undelivered code must stay in the outbox for the retry: %q", body())
	}
	b.clock.Advance(2 * time.Minute)
	if n, err := b.svc.DeliverOutbox(ctx); err != nil || n != 1 {
		t.Fatalf("retry: %d %v", n, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(texts) != 2 || texts[1] != texts[0] {
		t.Fatalf("the retry sent %q, want the same message with its code", texts)
	}
	if got := body(); strings.Contains(got, code) || !strings.Contains(got, "[redacted]") {
		t.Errorf("delivered outbox body %q still carries the code %s", got, code)
	}
}
