package stripegw

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"
)

// WebhookTolerance is how far a Stripe-Signature timestamp may be from now.
const WebhookTolerance = 300 * time.Second

// SignatureHeader is the header Stripe signs its webhook deliveries in.
const SignatureHeader = "Stripe-Signature"

var (
	// ErrWebhookSignature: the Stripe-Signature header is missing, malformed, or none of its v1
	// signatures matches the body under the secret.
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

// ParseWebhook verifies a Stripe webhook delivery and extracts the event.
//
// The signature is checked by stripe-go (webhook.ConstructEventWithOptions: HMAC-SHA256 over
// "<t>.<raw body>", any of several v1 signatures, constant-time comparison). Its own timestamp
// check is switched off and done here instead, against now, because stripe-go reads the wall
// clock and pitlane injects its clock; the rule is the same 300 s, applied in both directions
// (a timestamp from the future is as suspicious as an old one). The event's API version is not
// required to match stripe-go's: only the ids are read, and those do not change between versions.
//
// payload must be the raw request body, byte for byte.
func ParseWebhook(payload []byte, sigHeader string, secret string, now time.Time) (Event, error) {
	if secret == "" {
		return Event{}, errors.New("stripe webhook: no signing secret configured")
	}
	ev, err := webhook.ConstructEventWithOptions(payload, sigHeader, secret, webhook.ConstructEventOptions{
		IgnoreTolerance:          true,
		IgnoreAPIVersionMismatch: true,
	})
	if err != nil {
		if errors.Is(err, webhook.ErrNotSigned) || errors.Is(err, webhook.ErrInvalidHeader) || errors.Is(err, webhook.ErrNoValidSignature) {
			return Event{}, fmt.Errorf("%w: %w", ErrWebhookSignature, err)
		}
		return Event{}, fmt.Errorf("stripe webhook: %w", err)
	}

	// The header parsed and a signature matched, so t= is present and authenticated (it is part
	// of the signed string).
	signedAt, ok := signatureTime(sigHeader)
	if !ok {
		return Event{}, fmt.Errorf("%w: no timestamp", ErrWebhookSignature)
	}
	if d := now.Sub(signedAt); d > WebhookTolerance || d < -WebhookTolerance {
		return Event{}, fmt.Errorf("%w: signed at %s, now %s", ErrWebhookStale, signedAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}

	if ev.ID == "" {
		return Event{}, errors.New("stripe webhook: event without id")
	}
	out := Event{ID: ev.ID, Type: string(ev.Type)}
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

// signatureTime reads t= from a Stripe-Signature header ("t=1495999758,v1=…,v0=…"). A header
// with more than one t= is refused: stripe-go verifies against the last one, and a check here
// that read a different one could be fooled into accepting a replayed old signature under a
// fresh-looking timestamp.
func signatureTime(header string) (time.Time, bool) {
	var (
		at    time.Time
		found bool
	)
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || k != "t" {
			continue
		}
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil || found {
			return time.Time{}, false
		}
		at, found = time.Unix(sec, 0), true
	}
	return at, found
}
