package main

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	"pitlane/internal/config"
	"pitlane/payments"
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
