package main

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"pitlane/internal/config"
	"pitlane/payments"
	"pitlane/payments/gateway/gwmetrics"
	"pitlane/payments/gateway/gwtrace"
	"pitlane/payments/gateway/refgw"
	"pitlane/payments/gateway/stripegw"
	"pitlane/web"
)

// checkGateway reports, as a configuration error (exit 2), a gateway that cannot be built from
// the settings: refgw needs GATEWAY_URL and GATEWAY_API_KEY, stripe needs GATEWAY_API_KEY (its
// secret key; GATEWAY_URL defaults to Stripe's API). `dev` wires its simulator instead when
// GATEWAY_URL is unset, so only `serve` calls this.
func checkGateway(cfg config.Config, command string) error {
	switch cfg.Gateway {
	case config.GatewayStripe:
		if cfg.GatewayAPIKey == "" {
			return &config.Error{Var: "GATEWAY_API_KEY", Msg: fmt.Sprintf("required by `pitlane %s` with GATEWAY=stripe (the Stripe secret key, sk_…)", command)}
		}
	default:
		if cfg.GatewayURL == "" {
			return &config.Error{Var: "GATEWAY_URL", Msg: fmt.Sprintf("required by `pitlane %s` with GATEWAY=refgw (the reference gateway's base URL; `pitlane dev` runs a simulator instead)", command)}
		}
		if cfg.GatewayAPIKey == "" {
			return &config.Error{Var: "GATEWAY_API_KEY", Msg: fmt.Sprintf("required by `pitlane %s` with GATEWAY=refgw (the gateway's bearer key)", command)}
		}
	}
	return nil
}

// buildGateway builds the adapter GATEWAY names from the settings (command names the command
// in a configuration error), and that adapter's webhook verifier over every secret of
// GATEWAY_WEBHOOK_SECRET. The verifier is nil when no secret is configured: the receiver then
// refuses every event.
func buildGateway(cfg config.Config, logger *slog.Logger, command string) (payments.Gateway, payments.WebhookVerifier, error) {
	if err := checkGateway(cfg, command); err != nil {
		return nil, nil, err
	}
	var (
		gw          payments.Gateway
		newVerifier func(secrets []string) (payments.WebhookVerifier, error)
		err         error
	)
	switch cfg.Gateway {
	case config.GatewayStripe:
		gw, err = stripegw.New(stripegw.Options{SecretKey: cfg.GatewayAPIKey, BaseURL: cfg.GatewayURL, Timeout: cfg.GatewayTimeout,
			Logger: logger.With("component", "stripe"), HTTPClient: tracedClient()})
		newVerifier = func(secrets []string) (payments.WebhookVerifier, error) { return stripegw.NewWebhookVerifier(secrets) }
	default:
		gw, err = refgw.New(refgw.Options{BaseURL: cfg.GatewayURL, APIKey: cfg.GatewayAPIKey, Timeout: cfg.GatewayTimeout, HTTPClient: tracedClient()})
		newVerifier = func(secrets []string) (payments.WebhookVerifier, error) { return refgw.NewWebhookVerifier(secrets) }
	}
	if err != nil {
		return nil, nil, fmt.Errorf("gateway: %w", err)
	}
	secrets := cfg.WebhookSecrets()
	if len(secrets) == 0 {
		return gw, nil, nil
	}
	verifier, err := newVerifier(secrets)
	if err != nil {
		return nil, nil, fmt.Errorf("gateway: %w", err)
	}
	return gw, verifier, nil
}

// newService builds the locking core over the configured gateway, measured into metrics and
// traced into tp, and returns the gateway's webhook verifier with it (nil without
// GATEWAY_WEBHOOK_SECRET). Its times are clock's (nil: the host's).
func newService(cfg config.Config, pool *pgxpool.Pool, clock payments.Clock, logger *slog.Logger, metrics *web.Metrics, tp trace.TracerProvider) (*payments.Service, payments.WebhookVerifier, error) {
	gw, verifier, err := buildGateway(cfg, logger, "serve")
	if err != nil {
		return nil, nil, err
	}
	// Read under the metrics and the traces: an answer the core finds unreadable is counted as
	// the unknown failure it acts on, not "ok" (a review of readableAnswers).
	measured, err := gwmetrics.Wrap(payments.Readable(gw), metrics.Registry)
	if err != nil {
		return nil, nil, fmt.Errorf("gateway metrics: %w", err)
	}
	pcfg := payments.Config{
		Clock:          clock,
		Gateway:        gwtrace.Wrap(measured, tp),
		TracerProvider: tp,
		Logger:         logger.With("component", "payments"),
		ReplicaID:      cfg.ReplicaID,
		CodeSecret:     cfg.SecretKey,
		// SECRET_KEY_FALLBACKS: codes and checkout links made under them still verify.
		CodeSecretFallbacks: cfg.SecretKeyFallbacks,
		ReturnURL:           returnURL(cfg.PublicBaseURL),
		// Signed checkout links (the API's checkout-links, dev's demo link) are absolute.
		PublicBaseURL: cfg.PublicBaseURL,
		// The gateway's own origin may serve payment pages over http (dev's simulator).
		GatewayURL: cfg.GatewayURL,
		// GATEWAY_CONFIRMATION_HOSTS: the hosts whose https pages customers may be sent to.
		ConfirmationHosts: cfg.ConfirmationHosts,
		// The patrol's width, and the lease and in-flight graces derived from the gateway timeout.
		SweepConcurrency:  cfg.SweepConcurrency,
		GatewayTimeout:    cfg.GatewayTimeout,
		RefundDirectLimit: cfg.RefundDirectLimit,
		// RECONCILE_BATCH: sessions the reconciliation leader compares each minute.
		ReconcileBatch: cfg.ReconcileBatch,
		// CODE_REQUESTS_PER_CONTACT_PER_HOUR: codes to one customer contact, 0 unbounded.
		CodeRequestsPerContact: cfg.CodeRequestsPerContact,
	}
	if cfg.NotifyWebhookURL != "" {
		n := payments.WebhookNotifier{URL: cfg.NotifyWebhookURL, Secrets: cfg.NotifyWebhookSecrets}
		if clock != nil {
			// Signed on the service's clock (the database's), as the events webhook is: a host
			// clock minutes off stamped every code message outside the receiver's tolerance.
			n.Now = clock.Now
		}
		pcfg.Notifier = n
	}
	// EVENTS_WEBHOOK_URL: the events feed POSTed to the shop (off when unset).
	pcfg.EventsWebhook = payments.EventsWebhook{URL: cfg.EventsWebhookURL, Secrets: cfg.EventsWebhookSecrets}
	return payments.NewService(pool, pcfg), verifier, nil
}

// tracedClient is the adapters' HTTP client: it sends the trace context of each gateway call in
// the traceparent header (nothing when tracing is off).
func tracedClient() *http.Client {
	return &http.Client{Transport: gwtrace.Transport(gatewayTransport())}
}

// gatewayIdleConns is how many kept-alive connections to the gateway a replica keeps for reuse.
const gatewayIdleConns = 256

// gatewayTransport is http.DefaultTransport with room to keep connections to the gateway alive.
// Every call of a replica goes to that one host — each API Create's register, the patrol's
// SWEEP_CONCURRENCY drives — and the default keeps 2 idle connections per host: with 64 Creates
// registering at once, 62 connections were closed after each answer and dialled afresh for the
// next call (a TCP handshake on both sides and a socket in TIME_WAIT per Create; make bench's API
// figure). Idle connections still close after the default 90 s; the bound is per replica, not per
// order.
func gatewayTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = gatewayIdleConns
	t.MaxIdleConnsPerHost = gatewayIdleConns
	return t
}

// returnURL is where the gateway sends the customer after paying: the order's checkout page.
func returnURL(publicBase string) func(payments.Session) string {
	return func(s payments.Session) string {
		return publicBase + payments.CheckoutPath(s.OrderID)
	}
}
