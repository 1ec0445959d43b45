package main

import (
	"fmt"
	"log/slog"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/config"
	"pitlane/payments"
	"pitlane/payments/gateway/gwmetrics"
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

// buildGateway builds the adapter GATEWAY names from the settings.
func buildGateway(cfg config.Config, logger *slog.Logger) (payments.Gateway, error) {
	if err := checkGateway(cfg, "serve"); err != nil {
		return nil, err
	}
	switch cfg.Gateway {
	case config.GatewayStripe:
		gw, err := stripegw.New(stripegw.Options{SecretKey: cfg.GatewayAPIKey, BaseURL: cfg.GatewayURL, Timeout: cfg.GatewayTimeout,
			Logger: logger.With("component", "stripe")})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		return gw, nil
	default:
		gw, err := refgw.New(refgw.Options{BaseURL: cfg.GatewayURL, APIKey: cfg.GatewayAPIKey, Timeout: cfg.GatewayTimeout})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		return gw, nil
	}
}

// newService builds the locking core over the configured gateway, measured into metrics.
func newService(cfg config.Config, pool *pgxpool.Pool, logger *slog.Logger, metrics *web.Metrics) (*payments.Service, error) {
	gw, err := buildGateway(cfg, logger)
	if err != nil {
		return nil, err
	}
	measured, err := gwmetrics.Wrap(gw, metrics.Registry)
	if err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	pcfg := payments.Config{
		Gateway:    measured,
		Logger:     logger.With("component", "payments"),
		ReplicaID:  cfg.ReplicaID,
		CodeSecret: cfg.SecretKey,
		ReturnURL:  returnURL(cfg.PublicBaseURL),
		// Signed checkout links (the API's checkout-links, dev's demo link) are absolute.
		PublicBaseURL: cfg.PublicBaseURL,
		// The gateway's own origin may serve payment pages over http (dev's simulator).
		GatewayURL: cfg.GatewayURL,
	}
	if cfg.NotifyWebhookURL != "" {
		pcfg.Notifier = payments.WebhookNotifier{URL: cfg.NotifyWebhookURL}
	}
	return payments.NewService(pool, pcfg), nil
}

// returnURL is where the gateway sends the customer after paying: the order's checkout page.
func returnURL(publicBase string) func(payments.Session) string {
	return func(s payments.Session) string {
		return publicBase + "/checkout/" + url.PathEscape(s.OrderID)
	}
}
