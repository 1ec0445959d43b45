package handlers

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
	"pitlane/payments/gateway/stripegw"
	"pitlane/payments/gateway/webhooksig"
)

// Webhook signature schemes (GATEWAY).
const (
	WebhookSchemeRefgw  = "refgw"  // Gateway-Signature, gateway-api.md
	WebhookSchemeStripe = "stripe" // Stripe-Signature
)

// maxWebhookBody bounds what the receiver reads. Reference-gateway events are a few hundred
// bytes; Stripe events carry whole objects and stay well under this.
const maxWebhookBody = 1 << 20

// WebhookConfig configures the receiver.
type WebhookConfig struct {
	// Scheme is how events are signed: WebhookSchemeRefgw (default) or WebhookSchemeStripe.
	Scheme string
	// Secret is GATEWAY_WEBHOOK_SECRET. Empty: every event is refused (nothing can be verified).
	Secret string
	// Now is the clock of the timestamp tolerance. Nil: the payment service's clock.
	Now func() time.Time
}

// Webhooks receives the gateway's signed events (POST /webhooks/gateway).
type Webhooks struct {
	svc *payments.Service
	cfg WebhookConfig
	log *slog.Logger
}

// NewWebhooks builds the receiver. svc nil: events answer 503, so the gateway redelivers them to
// a replica that has the core wired.
func NewWebhooks(svc *payments.Service, cfg WebhookConfig, log *slog.Logger) *Webhooks {
	if log == nil {
		log = slog.Default()
	}
	if cfg.Scheme == "" {
		cfg.Scheme = WebhookSchemeRefgw
	}
	if cfg.Now == nil && svc != nil {
		cfg.Now = svc.Now
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Webhooks{svc: svc, cfg: cfg, log: log}
}

type webhookAnswer struct {
	Received bool   `json:"received"`
	Outcome  string `json:"outcome"`
}

// Receive verifies the signature over the raw body before anything else, so a forged or stale
// event writes nothing; then hands the event to the core, which records it once, applies it as a
// hint through Check and marks it processed. A failure to apply answers 5xx (from the core's
// error) so that the gateway delivers it again.
func (h *Webhooks) Receive(c echo.Context) error {
	if h.svc == nil {
		return &payments.Error{Code: payments.EUNAVAIL, Message: "the payment service is not configured on this replica"}
	}
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxWebhookBody+1))
	if err != nil {
		return echo.NewHTTPError(http.StatusBadRequest, "could not read the body")
	}
	if len(body) > maxWebhookBody {
		return echo.NewHTTPError(http.StatusRequestEntityTooLarge, "event too large")
	}
	var ev payments.GatewayEvent
	switch h.cfg.Scheme {
	case WebhookSchemeStripe:
		ev, err = h.verifyStripe(c.Request().Header.Get(stripegw.SignatureHeader), body)
	default:
		ev, err = h.verifyRefgw(c.Request().Header.Get(webhooksig.Header), body)
	}
	if err != nil {
		return err
	}
	res, err := h.svc.HandleGatewayEvent(c.Request().Context(), ev)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, webhookAnswer{Received: true, Outcome: string(res.Outcome)})
}

// refgwEvent is the reference gateway's event (gateway-api.md); unknown fields are ignored.
type refgwEvent struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	Data struct {
		ID        string `json:"id"`
		Reference string `json:"reference"`
	} `json:"data"`
}

func (h *Webhooks) verifyRefgw(header string, body []byte) (payments.GatewayEvent, error) {
	if header == "" {
		return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusBadRequest, "missing "+webhooksig.Header+" header")
	}
	if err := webhooksig.Verify(header, body, [][]byte{[]byte(h.cfg.Secret)}, h.cfg.Now(), webhooksig.DefaultTolerance); err != nil {
		switch {
		case errors.Is(err, webhooksig.ErrMalformed):
			return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusBadRequest, "malformed "+webhooksig.Header+" header")
		case errors.Is(err, webhooksig.ErrTooOld):
			return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusUnauthorized, "signature timestamp outside the 300 s tolerance")
		case errors.Is(err, webhooksig.ErrNoSecret):
			h.log.Warn("webhook refused: GATEWAY_WEBHOOK_SECRET is not set, so no event can be verified")
			return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusUnauthorized, "signature cannot be verified")
		default:
			return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusUnauthorized, "signature does not match")
		}
	}
	var raw refgwEvent
	if err := json.Unmarshal(body, &raw); err != nil {
		return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusBadRequest, "the event is not JSON")
	}
	if raw.ID == "" {
		return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusBadRequest, "the event has no id")
	}
	ev := payments.GatewayEvent{ID: raw.ID, Type: raw.Type}
	// Only payment events carry a payment in data; other types (a future refund.updated) are
	// acknowledged and recorded, not guessed at.
	if strings.HasPrefix(raw.Type, "payment.") {
		ev.PaymentID, ev.Reference = raw.Data.ID, raw.Data.Reference
	}
	return ev, nil
}

func (h *Webhooks) verifyStripe(header string, body []byte) (payments.GatewayEvent, error) {
	if header == "" {
		return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusBadRequest, "missing "+stripegw.SignatureHeader+" header")
	}
	if h.cfg.Secret == "" {
		h.log.Warn("webhook refused: GATEWAY_WEBHOOK_SECRET is not set, so no event can be verified")
		return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusUnauthorized, "signature cannot be verified")
	}
	sev, err := stripegw.ParseWebhook(body, header, h.cfg.Secret, h.cfg.Now())
	switch {
	case errors.Is(err, stripegw.ErrWebhookStale):
		return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusUnauthorized, "signature timestamp outside the 300 s tolerance")
	case errors.Is(err, stripegw.ErrWebhookSignature):
		return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusUnauthorized, "signature does not match")
	case err != nil:
		return payments.GatewayEvent{}, echo.NewHTTPError(http.StatusBadRequest, "the event could not be read")
	}
	return payments.GatewayEvent{ID: sev.ID, Type: sev.Type, PaymentID: sev.PaymentIntentID}, nil
}
