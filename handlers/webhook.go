package handlers

import (
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"pitlane/payments"
)

// maxWebhookBody bounds what the receiver reads. Reference-gateway events are a few hundred
// bytes; Stripe events carry whole objects and stay well under this.
const maxWebhookBody = 1 << 20

// WebhookConfig configures the receiver.
type WebhookConfig struct {
	// Verifier checks signatures and reads events: the configured gateway's adapter
	// (refgw.WebhookVerifier, stripegw.WebhookVerifier), built by cmd from GATEWAY and
	// GATEWAY_WEBHOOK_SECRET. Nil (no secret configured): every event is refused, since none
	// can be verified.
	Verifier payments.WebhookVerifier
	// Now is the clock of the timestamp tolerance. Nil: the payment service's clock.
	Now func() time.Time
}

// Webhooks receives the gateway's signed events (POST /webhooks/gateway). It knows no gateway
// by name: the verifier says which header carries the signature and turns a delivery into an
// event or a refusal.
type Webhooks struct {
	svc *payments.Service
	cfg WebhookConfig
	log *slog.Logger
}

// NewWebhooks builds the receiver over the core (required).
func NewWebhooks(svc *payments.Service, cfg WebhookConfig, log *slog.Logger) *Webhooks {
	if log == nil {
		log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = svc.Now
	}
	return &Webhooks{svc: svc, cfg: cfg, log: log}
}

type webhookAnswer struct {
	Received bool   `json:"received"`
	Outcome  string `json:"outcome"`
}

// Receive verifies the signature over the raw body before anything else, so a forged or stale
// event writes nothing (the verifier's refusal is a domain error: malformed → 400, bad or stale
// signature → 401); then hands the event to the core, which records it once, applies it as a
// hint through Check and marks it processed. A valid event answers 200, also when applying it
// failed this time (outcome "queued": the patrol retries it); only an event that could not be
// recorded answers 5xx, so that the gateway delivers it again.
func (h *Webhooks) Receive(c echo.Context) error {
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxWebhookBody+1))
	if err != nil {
		return echo.NewHTTPError(http.StatusBadRequest, "could not read the body")
	}
	if len(body) > maxWebhookBody {
		return echo.NewHTTPError(http.StatusRequestEntityTooLarge, "event too large")
	}
	if h.cfg.Verifier == nil {
		h.log.Warn("webhook refused: GATEWAY_WEBHOOK_SECRET is not set, so no event can be verified")
		return payments.Errorf(payments.EBADSIGNATURE, "signature cannot be verified: no webhook secret is configured")
	}
	ev, err := h.cfg.Verifier.VerifyEvent(c.Request().Header.Get(h.cfg.Verifier.SignatureHeader()), body, h.cfg.Now())
	if err != nil {
		return err
	}
	res, err := h.svc.HandleGatewayEvent(c.Request().Context(), ev)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, webhookAnswer{Received: true, Outcome: string(res.Outcome)})
}
