package refgw_test

import (
	"strings"
	"testing"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/refgw"
	"pitlane/payments/gateway/webhooksig"
)

var (
	whNow  = time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC) // far from the wall clock: now is what counts
	whBody = []byte(`{"id":"evt_1","type":"payment.updated","created":1931000000,
		"data":{"id":"gp_1","status":"succeeded","amount":1999,"currency":"EUR","reference":"ref-1"}}`)
)

// TestWebhookVerifierRotation: with GATEWAY_WEBHOOK_SECRET "old,new" an event signed with
// either verifies (alone or both in one header, as the sender does during a rotation), one
// signed with a third secret does not; a stale or future timestamp and an unreadable header are
// refused with their own codes.
func TestWebhookVerifierRotation(t *testing.T) {
	t.Parallel()
	v, err := refgw.NewWebhookVerifier([]string{"whsec_old", "", "whsec_new"})
	if err != nil {
		t.Fatal(err)
	}
	if v.SignatureHeader() != "Gateway-Signature" {
		t.Fatalf("header %q", v.SignatureHeader())
	}
	sign := func(at time.Time, secrets ...string) string {
		var ss [][]byte
		for _, s := range secrets {
			ss = append(ss, []byte(s))
		}
		return webhooksig.SignAll(ss, at, whBody)
	}
	want := payments.GatewayEvent{ID: "evt_1", Type: "payment.updated", PaymentID: "gp_1", Reference: "ref-1"}
	for name, header := range map[string]string{
		"old secret":                   sign(whNow, "whsec_old"),
		"new secret":                   sign(whNow, "whsec_new"),
		"both in one header":           sign(whNow, "whsec_new", "whsec_old"),
		"a third and the new":          sign(whNow, "whsec_third", "whsec_new"),
		"at the edge of the tolerance": sign(whNow.Add(-300*time.Second), "whsec_old"),
		// "Any match is enough": an entry this verifier cannot read voids no v1 beside it.
		"an entry without '=' beside": sign(whNow, "whsec_new") + ",foo",
	} {
		ev, err := v.VerifyEvent(header, whBody, whNow)
		if err != nil || ev != want {
			t.Errorf("%s: %+v %v; want %+v", name, ev, err, want)
		}
	}

	// The timestamp is whole seconds: signed 300 s ago is inside the tolerance for the whole
	// of that second (now's fraction made it 300.4 s, refused).
	if _, err := v.VerifyEvent(sign(whNow.Add(-300*time.Second), "whsec_new"), whBody, whNow.Add(999*time.Millisecond)); err != nil {
		t.Errorf("signed 300 s ago, read in the same second: %v", err)
	}

	for _, tc := range []struct {
		name, header string
		body         []byte
		code         string
	}{
		{"a third secret", sign(whNow, "whsec_third"), whBody, payments.EBADSIGNATURE},
		{"stale: 301 s old", sign(whNow.Add(-301*time.Second), "whsec_new"), whBody, payments.EBADSIGNATURE},
		{"from the future", sign(whNow.Add(301*time.Second), "whsec_old"), whBody, payments.EBADSIGNATURE},
		// 2^64 ns ahead: as a Duration the age wrapped to -0.29 s, inside the tolerance.
		{"centuries ahead", sign(time.Unix(whNow.Unix()+18446744074, 0), "whsec_old"), whBody, payments.EBADSIGNATURE},
		{"another body", sign(whNow, "whsec_new"), []byte(`{"id":"evt_2"}`), payments.EBADSIGNATURE},
		{"no header", "", whBody, payments.EMALFORMED},
		{"no timestamp", withoutTimestamp(sign(whNow, "whsec_new")), whBody, payments.EMALFORMED},
		{"no v1", "t=1931000000", whBody, payments.EMALFORMED},
		{"v1 not hex", "t=1931000000,v1=zz", whBody, payments.EMALFORMED},
		{"garbage", "garbage", whBody, payments.EMALFORMED},
		{"signed, but not JSON", webhooksig.Sign([]byte("whsec_new"), whNow, []byte("not json")), []byte("not json"), payments.EMALFORMED},
		{"signed, but no id", webhooksig.Sign([]byte("whsec_new"), whNow, []byte(`{"type":"payment.updated"}`)), []byte(`{"type":"payment.updated"}`), payments.EMALFORMED},
	} {
		ev, err := v.VerifyEvent(tc.header, tc.body, whNow)
		if payments.ErrorCode(err) != tc.code || ev != (payments.GatewayEvent{}) {
			t.Errorf("%s: %+v %v; want %s", tc.name, ev, err, tc.code)
		}
	}
}

// withoutTimestamp drops the t= entry of a valid header, keeping its signature.
func withoutTimestamp(header string) string {
	_, sigs, _ := strings.Cut(header, ",")
	return sigs
}

func TestWebhookVerifierNeedsASecret(t *testing.T) {
	t.Parallel()
	for _, secrets := range [][]string{nil, {""}} {
		if _, err := refgw.NewWebhookVerifier(secrets); err == nil {
			t.Errorf("%q: a verifier without a secret", secrets)
		}
	}
}

// Events that are not about a payment are read (recorded and acknowledged) without a payment.
func TestWebhookVerifierOtherEventTypes(t *testing.T) {
	t.Parallel()
	v, err := refgw.NewWebhookVerifier([]string{"whsec_new"})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range [][]byte{
		[]byte(`{"id":"evt_9","type":"refund.updated","data":{"id":"rf_1","payment_id":"gp_1"}}`),
		// Another type's data is not ours to judge: refused as malformed, it would be
		// redelivered for days.
		[]byte(`{"id":"evt_9","type":"refund.updated","data":[1,2]}`),
		[]byte(`{"id":"evt_9","type":"refund.updated","data":{"id":7}}`),
		[]byte(`{"id":"evt_9","type":"refund.updated"}`),
	} {
		ev, err := v.VerifyEvent(webhooksig.Sign([]byte("whsec_new"), whNow, body), body, whNow)
		if err != nil || ev != (payments.GatewayEvent{ID: "evt_9", Type: "refund.updated"}) {
			t.Errorf("%s: %+v %v", body, ev, err)
		}
	}
}

// Unknown fields are ignored, also those whose names differ from the contract's only in case:
// encoding/json matched them, and the later one won.
func TestWebhookVerifierMatchesNamesExactly(t *testing.T) {
	t.Parallel()
	v, err := refgw.NewWebhookVerifier([]string{"whsec_new"})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"evt_1","type":"payment.updated","data":{"id":"gp_1","reference":"ref-1","ID":"gp_other","Reference":"ref-other"},
		"ID":"evt_other","Type":"account.updated","Data":{"id":"gp_x"}}`)
	ev, err := v.VerifyEvent(webhooksig.Sign([]byte("whsec_new"), whNow, body), body, whNow)
	if want := (payments.GatewayEvent{ID: "evt_1", Type: "payment.updated", PaymentID: "gp_1", Reference: "ref-1"}); err != nil || ev != want {
		t.Fatalf("%+v %v, want %+v", ev, err, want)
	}
}
