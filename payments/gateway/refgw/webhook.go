package refgw

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"pitlane/payments"
	"pitlane/payments/gateway/webhooksig"
)

// WebhookVerifier verifies the reference gateway's signed webhook deliveries (gateway-api.md,
// "Webhooks") and reads their events: payments.WebhookVerifier for GATEWAY=refgw.
//
// The signature scheme itself lives in package webhooksig, which the simulator signs with too:
// one definition of the wire format for both sides, in a package that depends on nothing of
// pitlane. This type is the receiving adapter around it: which secrets, which tolerance, how a
// refusal becomes a domain error, and what of the body is read.
type WebhookVerifier struct {
	secrets   [][]byte
	tolerance time.Duration
}

var _ payments.WebhookVerifier = (*WebhookVerifier)(nil)

// NewWebhookVerifier builds a verifier that accepts a signature under any of secrets (during a
// rotation, the old and the new one). Empty entries are ignored; at least one secret is needed.
// The tolerance is the contract's 300 s.
func NewWebhookVerifier(secrets []string) (*WebhookVerifier, error) {
	v := &WebhookVerifier{tolerance: webhooksig.DefaultTolerance}
	for _, s := range secrets {
		if s != "" {
			v.secrets = append(v.secrets, []byte(s))
		}
	}
	if len(v.secrets) == 0 {
		return nil, errors.New("refgw: a webhook verifier needs at least one secret (GATEWAY_WEBHOOK_SECRET)")
	}
	return v, nil
}

// SignatureHeader implements payments.WebhookVerifier: Gateway-Signature.
func (v *WebhookVerifier) SignatureHeader() string { return webhooksig.Header }

// event is the reference gateway's event (gateway-api.md); unknown fields are ignored.
type event struct {
	ID   string          `json:"id"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"` // read only for payment events: another type's is not ours to judge
}

// eventPayment is what a payment event's data says that the receiver uses.
type eventPayment struct {
	ID        string `json:"id"`
	Reference string `json:"reference"`
}

// VerifyEvent implements payments.WebhookVerifier. The signature is checked over the raw body
// before the body is decoded (any v1 entry under any secret, constant-time, ±300 s from now);
// then only the event's id, its type and, for payment events, the payment id and our reference
// are read. Nothing else in the body is trusted: the receiver asks the gateway.
func (v *WebhookVerifier) VerifyEvent(header string, body []byte, now time.Time) (payments.GatewayEvent, error) {
	if header == "" {
		return payments.GatewayEvent{}, payments.Errorf(payments.EMALFORMED, "missing %s header", webhooksig.Header)
	}
	if err := webhooksig.Verify(header, body, v.secrets, now, v.tolerance); err != nil {
		switch {
		case errors.Is(err, webhooksig.ErrMalformed):
			return payments.GatewayEvent{}, &payments.Error{Code: payments.EMALFORMED, Message: "malformed " + webhooksig.Header + " header", Err: err}
		case errors.Is(err, webhooksig.ErrTooOld):
			return payments.GatewayEvent{}, &payments.Error{Code: payments.EBADSIGNATURE, Message: "signature timestamp outside the 300 s tolerance", Err: err}
		default:
			return payments.GatewayEvent{}, &payments.Error{Code: payments.EBADSIGNATURE, Message: "signature does not match", Err: err}
		}
	}
	// Keys are matched exactly (decodeExact): an unknown "ID" or "Data" must not stand in for
	// "id" and "data".
	var raw event
	if err := decodeExact(body, &raw); err != nil {
		return payments.GatewayEvent{}, &payments.Error{Code: payments.EMALFORMED, Message: "the event is not a JSON object with a string id and type", Err: err}
	}
	if raw.ID == "" {
		return payments.GatewayEvent{}, payments.Errorf(payments.EMALFORMED, "the event has no id")
	}
	ev := payments.GatewayEvent{ID: raw.ID, Type: raw.Type}
	// Only payment events carry a payment in data; other types (a future refund.updated, an
	// account event whose data is a list) are acknowledged and recorded, not guessed at, and
	// whatever their data is does not make them malformed (refused, they would be redelivered
	// for days).
	if strings.HasPrefix(raw.Type, "payment.") && len(raw.Data) > 0 {
		var p eventPayment
		if err := decodeExact(raw.Data, &p); err != nil {
			return payments.GatewayEvent{}, &payments.Error{Code: payments.EMALFORMED, Message: "the payment event's data is not a payment object", Err: err}
		}
		ev.PaymentID, ev.Reference = p.ID, p.Reference
	}
	return ev, nil
}
