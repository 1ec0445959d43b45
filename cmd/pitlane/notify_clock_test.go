package main

import (
	"context"
	"io"
	"log/slog"
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
	"pitlane/web"
)

// The customer-message webhook (NOTIFY_WEBHOOK_SECRET) signs on the service's clock, the
// database's, as the events webhook does: serve's newService built it without that clock, so it
// stamped one-time-code messages with the host's. On a replica whose host runs 10 minutes ahead
// of the database, a receiver on the right time refused every code message (its tolerance is
// 300 s): customers never got their cancel codes (an outside review).
func TestNotifyWebhookSignsWithTheServiceClock(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	secret := strings.Repeat("n", 32)
	type post struct {
		sig string
		raw []byte
	}
	got := make(chan post, 10)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		got <- post{sig: r.Header.Get(payments.EventsWebhookSignatureHeader), raw: raw}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer sink.Close()
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"SECRET_KEY": strings.Repeat("s", 32), "GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k",
			"NOTIFY_WEBHOOK_URL": sink.URL, "NOTIFY_WEBHOOK_SECRET": secret}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	dbClock := payments.NewManualClock(time.Now().Add(-10 * time.Minute)) // the database's time; this host runs 10 min ahead
	svc, _, err := newService(cfg, pool, dbClock, slog.New(slog.DiscardHandler), web.NewMetrics(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The payment is registered by another replica (a core on the same database, fake gateway).
	other := payments.NewService(pool, payments.Config{Clock: dbClock, Gateway: fakegw.New(), ReplicaID: "replica-b", CodeSecret: []byte(strings.Repeat("s", 32))})
	res, err := other.Create(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"},
		payments.CreateInput{OrderID: "o-tz-notify", Amount: 1500, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.RequestCancel(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "shop"}, res.Session.ID); err != nil {
		t.Fatal(err)
	}
	var p post
	select {
	case p = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the code message was never posted")
	}
	if err := webhooksig.Verify(p.sig, p.raw, [][]byte{[]byte(secret)}, dbClock.Now(), 0); err != nil {
		t.Fatalf("the code message's signature (%s) fails a receiver on the database's time %s: %v",
			p.sig[:strings.IndexByte(p.sig, ',')], dbClock.Now().UTC().Format(time.RFC3339), err)
	}
}
