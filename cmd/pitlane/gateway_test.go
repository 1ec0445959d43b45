package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	"pitlane/internal/config"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
	"pitlane/payments/gateway/refgw"
	"pitlane/payments/gateway/stripegw"
	"pitlane/payments/gateway/webhooksig"
)

// TestBuildGatewayVerifiesEveryWebhookSecret: the verifier is built in the same switch as the
// gateway, from GATEWAY_WEBHOOK_SECRET as a list: an event signed with the old or the new secret
// of a rotation verifies, one signed with a third does not. No secret: no verifier (the receiver
// then refuses everything).
func TestBuildGatewayVerifiesEveryWebhookSecret(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	now := time.Now()
	for _, tc := range []struct {
		gateway  string
		env      map[string]string
		body     []byte
		sign     func(secret string, body []byte) string
		verifier string
	}{
		{
			gateway: config.GatewayRefgw,
			env:     map[string]string{"GATEWAY_URL": "http://127.0.0.1:8090", "GATEWAY_API_KEY": "k"},
			body:    []byte(`{"id":"evt_1","type":"payment.updated","data":{"id":"gp_1","reference":"r"}}`),
			sign: func(secret string, body []byte) string {
				return webhooksig.Sign([]byte(secret), now, body)
			},
			verifier: fmt.Sprintf("%T", &refgw.WebhookVerifier{}),
		},
		{
			gateway: config.GatewayStripe,
			env:     map[string]string{"GATEWAY": "stripe", "GATEWAY_API_KEY": "sk_test_123"},
			body:    []byte(`{"id":"evt_1","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","object":"payment_intent"}}}`),
			sign: func(secret string, body []byte) string {
				return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Secret: secret, Timestamp: now, Payload: body}).Header
			},
			verifier: fmt.Sprintf("%T", &stripegw.WebhookVerifier{}),
		},
	} {
		load := func(secret string) config.Config {
			env := map[string]string{"GATEWAY_WEBHOOK_SECRET": secret}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg, err := config.Load(func(k string) string { return env[k] })
			if err != nil {
				t.Fatal(err)
			}
			return cfg
		}
		_, v, err := buildGateway(load(""), logger, "serve")
		if err != nil || v != nil {
			t.Fatalf("%s without a secret: verifier %v, %v; want none", tc.gateway, v, err)
		}
		_, v, err = buildGateway(load("whsec_old, whsec_new"), logger, "serve")
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%T", v); got != tc.verifier {
			t.Fatalf("%s: verifier %s, want %s", tc.gateway, got, tc.verifier)
		}
		for _, secret := range []string{"whsec_old", "whsec_new"} {
			if ev, err := v.VerifyEvent(tc.sign(secret, tc.body), tc.body, now); err != nil || ev.ID != "evt_1" {
				t.Errorf("%s: signed with %s: %+v %v", tc.gateway, secret, ev, err)
			}
		}
		if _, err := v.VerifyEvent(tc.sign("whsec_third", tc.body), tc.body, now); payments.ErrorCode(err) != payments.EBADSIGNATURE {
			t.Errorf("%s: signed with a third secret: %v, want %s", tc.gateway, err, payments.EBADSIGNATURE)
		}
	}
}

// TestGatewayConnectionsAreKeptAlive: a replica's calls all go to one gateway host, many at once
// (every API Create registers; the patrol drives SWEEP_CONCURRENCY sessions). Two rounds of 16
// registrations that are all in flight together (the simulator answers a round only once all 16
// arrived) must reuse the first round's 16 connections. With http.DefaultTransport's 2 idle
// connections per host the second round dialled 14 new ones (30 in all): a TCP handshake and a
// socket in TIME_WAIT per registration under load.
func TestGatewayConnectionsAreKeptAlive(t *testing.T) {
	t.Parallel()
	const n = 16
	sim := gatewaysim.New(gatewaysim.Options{APIKey: "k"})
	defer sim.Close()
	var (
		mu      sync.Mutex
		waiting int
		gate    = make(chan struct{})
		dialled atomic.Int32
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		g := gate
		if waiting++; waiting == n { // the round is complete: answer all of it
			close(gate)
			gate, waiting = make(chan struct{}), 0
		}
		mu.Unlock()
		<-g
		sim.ServeHTTP(w, r)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialled.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"GATEWAY_URL": srv.URL, "GATEWAY_API_KEY": "k"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	gw, _, err := buildGateway(cfg, slog.New(slog.DiscardHandler), "serve")
	if err != nil {
		t.Fatal(err)
	}
	defer gw.(interface{ CloseIdleConnections() }).CloseIdleConnections()
	for round := range 2 {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				key := fmt.Sprintf("00000000-0000-4000-8000-%012d", round*n+i)
				if _, err := gw.Register(context.Background(), payments.RegisterRequest{IdempotencyKey: key, Reference: key,
					Amount: 100, Currency: "EUR", ReturnURL: "http://127.0.0.1/return"}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	if got := dialled.Load(); got != n {
		t.Fatalf("connections to the gateway for 2 rounds of %d concurrent calls = %d, want %d (the first round's, kept alive)", n, got, n)
	}
}
