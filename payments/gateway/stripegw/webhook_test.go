package stripegw

import (
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	"pitlane/payments"
)

const whSecret = "whsec_test_pitlane"

// The injected clock: deliberately far from the wall clock, so a check that read time.Now
// instead of now would fail these tests.
var whNow = time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)

func signed(payload string, at time.Time, secret string) string {
	return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{
		Payload: []byte(payload), Secret: secret, Timestamp: at,
	}).Header
}

const piEvent = `{"id":"evt_1","object":"event","api_version":"2019-02-19","created":1931000000,"type":"payment_intent.succeeded",
 "data":{"object":{"id":"pi_123","object":"payment_intent","status":"succeeded"}}}`

func TestParseWebhook(t *testing.T) {
	t.Parallel()

	t.Run("good", func(t *testing.T) {
		t.Parallel()
		ev, err := ParseWebhook([]byte(piEvent), signed(piEvent, whNow.Add(-10*time.Second), whSecret), []string{whSecret}, whNow)
		if err != nil {
			t.Fatal(err)
		}
		want := Event{ID: "evt_1", Type: "payment_intent.succeeded", PaymentIntentID: "pi_123", Created: time.Unix(1931000000, 0).UTC()}
		if ev != want {
			t.Fatalf("got %+v, want %+v", ev, want)
		}
	})

	t.Run("exactly at the tolerance is accepted", func(t *testing.T) {
		t.Parallel()
		if _, err := ParseWebhook([]byte(piEvent), signed(piEvent, whNow.Add(-300*time.Second), whSecret), []string{whSecret}, whNow); err != nil {
			t.Fatal(err)
		}
	})

	// The timestamp is in whole seconds, and so is the rule: now's fraction made it 300.4 s
	// (an outside review; webhooksig's rule for refgw).
	t.Run("exactly at the tolerance, a fraction into the second, is accepted", func(t *testing.T) {
		t.Parallel()
		now := whNow.Add(400 * time.Millisecond)
		if _, err := ParseWebhook([]byte(piEvent), signed(piEvent, whNow.Add(-300*time.Second), whSecret), []string{whSecret}, now); err != nil {
			t.Fatal(err)
		}
		if _, err := ParseWebhook([]byte(piEvent), signed(piEvent, whNow.Add(300*time.Second), whSecret), []string{whSecret}, now); err != nil {
			t.Fatal(err)
		}
	})

	// An endpoint on an API version before 2017-05-25 renders "request" as a string: decoded
	// into stripe.Event, every delivery was refused as malformed (an outside review).
	t.Run("an event of an old API version is read", func(t *testing.T) {
		t.Parallel()
		const old = `{"id":"evt_old","object":"event","api_version":"2017-04-06","created":1931000000,"request":"req_abc123",
 "type":"payment_intent.succeeded","data":{"object":{"id":"pi_789","object":"payment_intent","status":"succeeded"}}}`
		ev, err := ParseWebhook([]byte(old), signed(old, whNow, whSecret), []string{whSecret}, whNow)
		if err != nil || ev.ID != "evt_old" || ev.PaymentIntentID != "pi_789" {
			t.Fatalf("got %+v, %v", ev, err)
		}
	})

	t.Run("charge event names its payment intent", func(t *testing.T) {
		t.Parallel()
		body := `{"id":"evt_2","object":"event","type":"charge.refunded","data":{"object":{"id":"ch_1","object":"charge","payment_intent":"pi_456"}}}`
		ev, err := ParseWebhook([]byte(body), signed(body, whNow, whSecret), []string{whSecret}, whNow)
		if err != nil || ev.PaymentIntentID != "pi_456" || ev.ID != "evt_2" {
			t.Fatalf("got %+v, %v", ev, err)
		}
	})

	t.Run("event about no payment intent", func(t *testing.T) {
		t.Parallel()
		body := `{"id":"evt_3","object":"event","type":"customer.created","data":{"object":{"id":"cus_1","object":"customer"}}}`
		ev, err := ParseWebhook([]byte(body), signed(body, whNow, whSecret), []string{whSecret}, whNow)
		if err != nil || ev.PaymentIntentID != "" || ev.ID != "evt_3" {
			t.Fatalf("got %+v, %v", ev, err)
		}
	})

	t.Run("secret rotation: any v1 matches", func(t *testing.T) {
		t.Parallel()
		good := hex.EncodeToString(webhook.ComputeSignature(whNow, []byte(piEvent), whSecret))
		bad := hex.EncodeToString(webhook.ComputeSignature(whNow, []byte(piEvent), "whsec_old"))
		header := fmt.Sprintf("t=%d,v1=%s,v1=%s", whNow.Unix(), bad, good)
		if _, err := ParseWebhook([]byte(piEvent), header, []string{whSecret}, whNow); err != nil {
			t.Fatal(err)
		}
	})

	refusals := []struct {
		name    string
		payload string
		header  string
		want    error
	}{
		{"wrong secret", piEvent, signed(piEvent, whNow, "whsec_someone_else"), ErrWebhookSignature},
		{"one flipped body byte", flipByte(piEvent), signed(piEvent, whNow, whSecret), ErrWebhookSignature},
		{"no header", piEvent, "", ErrWebhookMalformed},
		{"garbage header", piEvent, "garbage", ErrWebhookMalformed},
		{"no timestamp", piEvent, "v1=" + hex.EncodeToString(webhook.ComputeSignature(whNow, []byte(piEvent), whSecret)), ErrWebhookMalformed},
		{"v0 only", piEvent, fmt.Sprintf("t=%d,v0=%s", whNow.Unix(), hex.EncodeToString(webhook.ComputeSignature(whNow, []byte(piEvent), whSecret))), ErrWebhookMalformed},
		{"stale: 301 s old", piEvent, signed(piEvent, whNow.Add(-301*time.Second), whSecret), ErrWebhookStale},
		{"stale: days late", piEvent, signed(piEvent, whNow.Add(-72*time.Hour), whSecret), ErrWebhookStale},
		{"from the future", piEvent, signed(piEvent, whNow.Add(301*time.Second), whSecret), ErrWebhookStale},
		// A replayed old delivery with a fresh t= put in front: stripe-go verifies the last t=, so
		// the tolerance check must not read another one.
		{"replay with a second, fresh timestamp", piEvent,
			fmt.Sprintf("t=%d,", whNow.Unix()) + signed(piEvent, whNow.Add(-time.Hour), whSecret), ErrWebhookMalformed},
	}
	for _, tc := range refusals {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			t.Parallel()
			ev, err := ParseWebhook([]byte(tc.payload), tc.header, []string{whSecret}, whNow)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %+v, %v; want %v", ev, err, tc.want)
			}
			if ev != (Event{}) {
				t.Fatalf("a refused webhook returned an event: %+v", ev)
			}
		})
	}

	t.Run("refused: valid signature over a body that is not an event", func(t *testing.T) {
		t.Parallel()
		for _, body := range []string{`not json`, `{"object":"event","type":"x"}`} {
			if _, err := ParseWebhook([]byte(body), signed(body, whNow, whSecret), []string{whSecret}, whNow); err == nil {
				t.Fatalf("%q accepted", body)
			}
		}
	})

	t.Run("refused: no secret configured", func(t *testing.T) {
		t.Parallel()
		if _, err := ParseWebhook([]byte(piEvent), signed(piEvent, whNow, ""), []string{""}, whNow); err == nil {
			t.Fatal("accepted with an empty secret")
		}
	})
}

func flipByte(s string) string {
	b := []byte(s)
	b[len(b)/2] ^= 0x01
	return string(b)
}

// TestWebhookVerifierRotation: with GATEWAY_WEBHOOK_SECRET "old,new" a delivery signed with
// either verifies (alone, or both in one header as Stripe sends them while an endpoint's secret
// is rolled), one signed with a third does not; stale and unreadable deliveries are refused with
// their own domain codes (401 and 400 at the receiver).
func TestWebhookVerifierRotation(t *testing.T) {
	t.Parallel()
	v, err := NewWebhookVerifier([]string{"whsec_old", "whsec_new"})
	if err != nil {
		t.Fatal(err)
	}
	if v.SignatureHeader() != "Stripe-Signature" {
		t.Fatalf("header %q", v.SignatureHeader())
	}
	sig := func(secret string) string {
		return hex.EncodeToString(webhook.ComputeSignature(whNow, []byte(piEvent), secret))
	}
	want := payments.GatewayEvent{ID: "evt_1", Type: "payment_intent.succeeded", PaymentID: "pi_123"}
	for name, header := range map[string]string{
		"old secret":          signed(piEvent, whNow, "whsec_old"),
		"new secret":          signed(piEvent, whNow, "whsec_new"),
		"both in one header":  fmt.Sprintf("t=%d,v1=%s,v1=%s", whNow.Unix(), sig("whsec_new"), sig("whsec_old")),
		"a third and the old": fmt.Sprintf("t=%d,v1=%s,v1=%s", whNow.Unix(), sig("whsec_third"), sig("whsec_old")),
	} {
		ev, err := v.VerifyEvent(header, []byte(piEvent), whNow)
		if err != nil || ev != want {
			t.Errorf("%s: %+v %v; want %+v", name, ev, err, want)
		}
	}
	for _, tc := range []struct {
		name, header string
		code         string
	}{
		{"a third secret", signed(piEvent, whNow, "whsec_third"), payments.EBADSIGNATURE},
		{"stale: 301 s old", signed(piEvent, whNow.Add(-301*time.Second), "whsec_new"), payments.EBADSIGNATURE},
		{"from the future", signed(piEvent, whNow.Add(301*time.Second), "whsec_old"), payments.EBADSIGNATURE},
		{"no header", "", payments.EMALFORMED},
		{"garbage header", "garbage", payments.EMALFORMED},
		{"no v1", fmt.Sprintf("t=%d", whNow.Unix()), payments.EMALFORMED},
	} {
		ev, err := v.VerifyEvent(tc.header, []byte(piEvent), whNow)
		if payments.ErrorCode(err) != tc.code || ev != (payments.GatewayEvent{}) {
			t.Errorf("%s: %+v %v; want %s", tc.name, ev, err, tc.code)
		}
	}
	if _, err := NewWebhookVerifier([]string{"", ""}); err == nil {
		t.Error("a verifier without a secret")
	}
}
