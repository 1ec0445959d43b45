package stripegw

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"

	"pitlane/payments"
)

// WebhookTolerance is how far a Stripe-Signature timestamp may be from now.
const WebhookTolerance = 300 * time.Second

// SignatureHeader is the header Stripe signs its webhook deliveries in.
const SignatureHeader = "Stripe-Signature"

var (
	// ErrWebhookMalformed: the Stripe-Signature header is missing or cannot be read (no t=, two
	// t=, no v1 entry, an entry without '='), or a validly signed body is not an event.
	ErrWebhookMalformed = errors.New("stripe webhook: malformed delivery")
	// ErrWebhookSignature: none of the header's v1 signatures matches the body under any of the
	// secrets.
	ErrWebhookSignature = errors.New("stripe webhook: signature verification failed")
	// ErrWebhookStale: the signature is valid but its timestamp is more than WebhookTolerance
	// away from now (a replayed delivery, or a clock far off).
	ErrWebhookStale = errors.New("stripe webhook: timestamp outside tolerance")
)

// Event is what pitlane takes from a Stripe webhook: only a hint. The receiver records ID (unique)
// so a redelivery does nothing, then fetches the PaymentIntent with Status and applies THAT through
// the ordinary Check path; nothing in the event body is trusted beyond identifying the payment.
type Event struct {
	ID   string // evt_…
	Type string // e.g. payment_intent.succeeded, charge.refunded
	// PaymentIntentID is the PaymentIntent the event is about: data.object itself when it is a
	// payment_intent, else its payment_intent field (charges, refunds, disputes). Empty when the
	// event concerns no PaymentIntent; the receiver acknowledges and ignores it.
	PaymentIntentID string
	Created         time.Time
}

// ParseWebhook verifies a Stripe webhook delivery against any of secrets and extracts the event.
//
// The signature is checked by stripe-go (webhook.ValidatePayloadIgnoringTolerance: HMAC-SHA256 over
// "<t>.<raw body>", any of several v1 signatures, constant-time comparison), once per secret
// until one matches: during a rotation of the endpoint's signing secret Stripe signs with both
// (two v1 entries) and pitlane holds both, and either side may move first. Its own timestamp
// check is switched off and done here instead, against now, because stripe-go reads the wall
// clock and pitlane injects its clock; the rule is the same 300 s, applied in both directions
// (a timestamp from the future is as suspicious as an old one). The event's API version is not
// required to match stripe-go's: only the ids, type and time are decoded, and those do not change
// between versions.
//
// The header is read here first, so that what cannot be a signature at all (ErrWebhookMalformed)
// is told apart from a signature that does not match (ErrWebhookSignature).
//
// payload must be the raw request body, byte for byte.
func ParseWebhook(payload []byte, sigHeader string, secrets []string, now time.Time) (Event, error) {
	var usable []string
	for _, s := range secrets {
		if s != "" {
			usable = append(usable, s)
		}
	}
	if len(usable) == 0 {
		return Event{}, errors.New("stripe webhook: no signing secret configured")
	}
	signedAt, err := readSignatureHeader(sigHeader)
	if err != nil {
		return Event{}, err
	}
	for _, secret := range usable {
		err = webhook.ValidatePayloadIgnoringTolerance(payload, sigHeader, secret)
		if !errors.Is(err, webhook.ErrNoValidSignature) {
			break
		}
	}
	switch {
	case errors.Is(err, webhook.ErrNoValidSignature):
		return Event{}, fmt.Errorf("%w: %w", ErrWebhookSignature, err)
	case err != nil:
		return Event{}, fmt.Errorf("%w: %w", ErrWebhookMalformed, err)
	}

	// A signature matched, so t= is authenticated (it is part of the signed string). Whole
	// seconds, as the timestamp is (webhooksig's rule): now's fraction made a delivery signed
	// exactly 300 s ago 300.4 s old, refused (an outside review).
	if age := now.Unix() - signedAt.Unix(); age > int64(WebhookTolerance/time.Second) || age < -int64(WebhookTolerance/time.Second) {
		return Event{}, fmt.Errorf("%w: signed at %s, now %s", ErrWebhookStale, signedAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}

	// Only the fields read, whatever the endpoint's API version renders around them: decoded
	// into stripe.Event, a version before 2017-05-25 (its "request" a string, not an object)
	// failed every delivery as malformed (an outside review).
	var ev struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Created int64  `json:"created"`
		Data    *struct {
			Object map[string]any `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(payload, &ev); err != nil {
		// The signature matched: a signed body that is not an event.
		return Event{}, fmt.Errorf("%w: %w", ErrWebhookMalformed, err)
	}
	if ev.ID == "" {
		return Event{}, fmt.Errorf("%w: event without id", ErrWebhookMalformed)
	}
	out := Event{ID: ev.ID, Type: ev.Type}
	if ev.Created != 0 {
		out.Created = time.Unix(ev.Created, 0).UTC()
	}
	if ev.Data != nil {
		obj := ev.Data.Object
		if kind, _ := obj["object"].(string); kind == "payment_intent" {
			out.PaymentIntentID, _ = obj["id"].(string)
		} else {
			// Unexpanded, payment_intent is an id string; an expanded object is not something
			// Stripe sends in webhooks, and is ignored rather than guessed at.
			out.PaymentIntentID, _ = obj["payment_intent"].(string)
		}
	}
	return out, nil
}

// readSignatureHeader reads a Stripe-Signature header ("t=1495999758,v1=…,v1=…,v0=…") far enough
// to know it could carry a signature: exactly one t= with an integer, at least one v1= entry,
// every entry a key=value pair. It returns the timestamp. A header with more than one t= is
// refused: stripe-go verifies against the last one, and a tolerance check here that read a
// different one could be fooled into accepting a replayed old signature under a fresh-looking
// timestamp.
func readSignatureHeader(header string) (time.Time, error) {
	if header == "" {
		return time.Time{}, fmt.Errorf("%w: no %s header", ErrWebhookMalformed, SignatureHeader)
	}
	var (
		at    time.Time
		found bool
		v1    int
	)
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return time.Time{}, fmt.Errorf("%w: entry %q has no '='", ErrWebhookMalformed, part)
		}
		switch k {
		case "t":
			sec, err := strconv.ParseInt(v, 10, 64)
			if err != nil || found {
				return time.Time{}, fmt.Errorf("%w: a bad or second timestamp", ErrWebhookMalformed)
			}
			at, found = time.Unix(sec, 0), true
		case "v1":
			v1++
		}
	}
	if !found {
		return time.Time{}, fmt.Errorf("%w: no timestamp", ErrWebhookMalformed)
	}
	if v1 == 0 {
		return time.Time{}, fmt.Errorf("%w: no v1 signature", ErrWebhookMalformed)
	}
	return at, nil
}

// WebhookVerifier verifies Stripe's webhook deliveries (Stripe-Signature) under the endpoint's
// signing secrets: payments.WebhookVerifier for GATEWAY=stripe.
type WebhookVerifier struct {
	secrets []string
}

var _ payments.WebhookVerifier = (*WebhookVerifier)(nil)

// NewWebhookVerifier builds a verifier that accepts a signature under any of secrets (whsec_…;
// during a rotation, the old and the new one). Empty entries are ignored; at least one is needed.
func NewWebhookVerifier(secrets []string) (*WebhookVerifier, error) {
	v := &WebhookVerifier{}
	for _, s := range secrets {
		if s != "" {
			v.secrets = append(v.secrets, s)
		}
	}
	if len(v.secrets) == 0 {
		return nil, errors.New("stripe: a webhook verifier needs at least one signing secret (GATEWAY_WEBHOOK_SECRET)")
	}
	return v, nil
}

// SignatureHeader implements payments.WebhookVerifier: Stripe-Signature.
func (v *WebhookVerifier) SignatureHeader() string { return SignatureHeader }

// VerifyEvent implements payments.WebhookVerifier through ParseWebhook. A Stripe event names
// only the PaymentIntent, never our reference: the core asks Stripe for it when no session has
// that id yet.
func (v *WebhookVerifier) VerifyEvent(header string, body []byte, now time.Time) (payments.GatewayEvent, error) {
	ev, err := ParseWebhook(body, header, v.secrets, now)
	switch {
	case errors.Is(err, ErrWebhookStale):
		return payments.GatewayEvent{}, &payments.Error{Code: payments.EBADSIGNATURE, Message: "signature timestamp outside the 300 s tolerance", Err: err}
	case errors.Is(err, ErrWebhookSignature):
		return payments.GatewayEvent{}, &payments.Error{Code: payments.EBADSIGNATURE, Message: "signature does not match", Err: err}
	case errors.Is(err, ErrWebhookMalformed):
		return payments.GatewayEvent{}, &payments.Error{Code: payments.EMALFORMED, Message: "the delivery could not be read (" + SignatureHeader + " header or event)", Err: err}
	case err != nil:
		return payments.GatewayEvent{}, &payments.Error{Code: payments.EINTERNAL, Message: "verify webhook", Err: err}
	}
	return payments.GatewayEvent{ID: ev.ID, Type: ev.Type, PaymentID: ev.PaymentIntentID}, nil
}
