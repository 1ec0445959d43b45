package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/payments/gateway/webhooksig"
)

// serve with EVENTS_WEBHOOK_URL: its patrol POSTs the shop every change after delivery began,
// signed with EVENTS_WEBHOOK_SECRET. The payment is made by another replica (a core on the same
// database) after serve started delivering.
func TestServePushesEventsToTheShop(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	secret := strings.Repeat("w", 32)
	got := make(chan payments.FeedEventBody, 100)
	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		if err := webhooksig.Verify(r.Header.Get(payments.EventsWebhookSignatureHeader), raw, [][]byte{[]byte(secret)}, time.Now(), 0); err != nil {
			t.Errorf("signature: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var body payments.FeedBody
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Errorf("body: %v", err)
		}
		for _, e := range body.Data {
			got <- e
		}
	}))
	defer shop.Close()
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "SECRET_KEY": strings.Repeat("s", 32),
			"GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k", "SWEEP_INTERVAL": "20ms",
			"EVENTS_WEBHOOK_URL": shop.URL, "EVENTS_WEBHOOK_SECRET": secret}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	_, stop := startRun(t, cfg, pool) // a failure before stop: startRun's cleanup cancels serve
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for started := 0; started == 0; {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM events_webhook`).Scan(&started); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("serve never began delivering")
		}
	}
	other := payments.NewService(pool, payments.Config{Gateway: fakegw.New(), ReplicaID: "replica-b", CodeSecret: []byte("test-secret")})
	res, err := other.Create(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, payments.CreateInput{OrderID: "o-pushed", Amount: 4200, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Registering", "Registered"} {
		select {
		case e := <-got:
			if e.PaymentID != res.Session.ID || e.OrderID != "o-pushed" || e.Status != want || e.Amount != 4200 {
				t.Fatalf("the shop got %+v, want o-pushed %s", e, want)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("the shop never got o-pushed's %s", want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
