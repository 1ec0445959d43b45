package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
)

// devSimulator is the reference-gateway simulator `pitlane dev` runs in-process, on its own
// loopback listener, so that the newcomer's one command has a gateway with a hosted payment page,
// capture, expiry and signed webhooks.
type devSimulator struct {
	sim *gatewaysim.Sim
	url string
}

// Simulator timing in dev: a customer has half an hour to pay; an approved payment is captured
// two seconds later; time rules are applied four times a second.
const (
	devSimTick         = 250 * time.Millisecond
	devSimCaptureDelay = 2 * time.Second
	devSimExpireAfter  = 30 * time.Minute
)

// usesDevSimulator: dev runs the simulator unless the settings name another gateway.
func usesDevSimulator(cfg config.Config) bool {
	return cfg.Gateway == config.GatewayRefgw && cfg.GatewayURL == ""
}

// startDevSimulator listens on 127.0.0.1 (the HTTP port + 10 when that is free, so its hosted
// page keeps one address across restarts; any free port otherwise), starts the simulator with
// webhooks to this replica's /webhooks/gateway, and points cfg at it. Secrets that are not
// configured are made up: the API key is the simulator's default, the webhook secret is derived
// from SECRET_KEY (stable across restarts of the same dev directory).
//
// statePath (non-empty) is where the simulator keeps its payments between runs: loaded before it
// serves, saved when it stops. dev keeps its database across restarts, and a simulator that
// forgot its payments left the demo's sessions pointing at nothing (dead hosted-page links, the
// patrol flagging every one for finance).
func startDevSimulator(cfg *config.Config, logger *slog.Logger, statePath string) (*devSimulator, func(), error) {
	ln, err := listenNear(cfg.HTTPAddr, 10)
	if err != nil {
		return nil, nil, fmt.Errorf("dev: gateway simulator: %w", err)
	}
	if cfg.GatewayAPIKey == "" {
		cfg.GatewayAPIKey = gatewaysim.DefaultAPIKey
	}
	if len(cfg.WebhookSecrets()) == 0 {
		m := hmac.New(sha256.New, cfg.SecretKey)
		m.Write([]byte("pitlane dev gateway webhook secret"))
		cfg.GatewayWebhookSecret = "whsec_dev_" + hex.EncodeToString(m.Sum(nil))[:32]
	}
	base := "http://" + ln.Addr().String()
	sim := gatewaysim.New(gatewaysim.Options{
		APIKey:     cfg.GatewayAPIKey,
		WebhookURL: cfg.PublicBaseURL + "/webhooks/gateway",
		// A configured list (a rotation being tried out): the simulator signs with the first;
		// the receiver accepts any of them.
		WebhookSecret: cfg.WebhookSecrets()[0],
		CaptureDelay:  devSimCaptureDelay,
		ExpireAfter:   devSimExpireAfter,
		PublicURL:     base,
		Logger:        logger.With("component", "gatewaysim"),
		TickInterval:  devSimTick,
	})
	if statePath != "" {
		if err := sim.LoadState(statePath); err != nil {
			// The demo still runs, with a simulator that knows nothing of earlier runs; the file
			// is kept aside, not overwritten by this run's state at stop.
			aside := statePath + ".unreadable"
			rerr := os.Rename(statePath, aside)
			logger.Warn("dev: gateway simulator starts empty", "err", err, "kept_as", aside, "rename_err", rerr)
		}
	}
	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	cfg.Gateway = config.GatewayRefgw
	cfg.GatewayURL = base

	stop := func() {
		// The simulator first: it releases parked calls, so Shutdown does not wait on them.
		_ = sim.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			logger.Warn("dev: gateway simulator shutdown", "err", err)
		}
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Warn("dev: gateway simulator", "err", err)
		}
		if statePath != "" {
			if err := sim.SaveState(statePath); err != nil {
				logger.Warn("dev: gateway simulator state not kept", "err", err)
			}
		}
	}
	return &devSimulator{sim: sim, url: base}, stop, nil
}

// listenNear listens on 127.0.0.1 at the port of addr plus offset, or on any free port when
// that is taken or addr's port is 0.
func listenNear(addr string, offset int) (net.Listener, error) {
	if _, port, err := net.SplitHostPort(addr); err == nil {
		if p, err := strconv.Atoi(port); err == nil && p != 0 && p+offset <= 65535 {
			if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+offset))); err == nil {
				return ln, nil
			}
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// devStart carries what `pitlane dev` learns while the server starts (the simulator, the demo
// seeding) to what it prints once everything runs.
type devStart struct {
	logger  *slog.Logger
	withSim bool
	// simState is where the in-process simulator keeps its payments between runs.
	simState string
	// seed: demo orders and logins go into the database (dev's private one, or --demo).
	seed bool

	sim      *devSimulator
	cfg      config.Config // as the server runs with it
	svc      *payments.Service
	seeded   int
	seedErr  error
	staffErr error
	staff    []string // the banner's demo logins (seedStaff)
	cli      string   // the banner's commands' start (devCLI)
}

// prepare starts the simulator (serveOptions.prepare), or checks the configured gateway.
func (d *devStart) prepare(_ context.Context, cfg *config.Config) (func(), error) {
	if !d.withSim {
		return func() {}, checkGateway(*cfg, "dev")
	}
	sim, stop, err := startDevSimulator(cfg, d.logger, d.simState)
	d.sim = sim
	return stop, err
}

// started seeds the demo logins and orders (serveOptions.started) when dev may. A failure is
// reported, not fatal: the server runs without them.
func (d *devStart) started(ctx context.Context, cfg config.Config, svc *payments.Service) error {
	d.cfg, d.svc = cfg, svc
	if !d.seed {
		return nil
	}
	d.staff, d.staffErr = seedStaff(ctx, access.New(svc.DB(), svc)) // the service's clock: the database's
	if d.sim == nil {
		return d.staffErr
	}
	d.seeded, d.seedErr = seedDemo(ctx, cfg, svc, d.sim.sim)
	return errors.Join(d.staffErr, d.seedErr)
}

// reconcileCommand is the banner's `pitlane reconcile` against the simulator. Only the
// simulator's own test key is printed: one configured (GATEWAY_API_KEY set, GATEWAY_URL not) is
// the operator's, maybe a real one, and stays in the environment (a review).
func reconcileCommand(simURL, key, cli string) string {
	shown := `"$GATEWAY_API_KEY"`
	if key == gatewaysim.DefaultAPIKey {
		shown = key
	}
	return "GATEWAY_URL=" + simURL + " GATEWAY_API_KEY=" + shown + " " + cli + " reconcile --since 24h"
}

// printReady is the banner: where the console, the database and the gateway are, and the demo.
func (d *devStart) printReady(ctx context.Context, w io.Writer, url, dbNote string, migrated int) {
	fmt.Fprintf(w, "\npitlane dev is running\n  console:  %s/\n  database: %s\n  migrations applied now: %d\n", url, dbNote, migrated)
	// The shop's first step (docs/api.md, "A first call"): a key for the JSON API.
	fmt.Fprintf(w, "  shop API: %s apikey create \"shop backend\"  (prints a key for Authorization: Bearer)\n", d.cli)
	switch {
	case d.sim != nil:
		fmt.Fprintf(w, "  gateway:  simulator at %s (hosted pages %s/pay/{id}, control API %s/_sim/state); its webhooks go to %s/webhooks/gateway\n",
			d.sim.url, d.sim.url, d.sim.url, url)
		fmt.Fprintf(w, "  reconcile: %s\n", reconcileCommand(d.sim.url, d.cfg.GatewayAPIKey, d.cli))
	case d.cfg.GatewayURL != "":
		fmt.Fprintf(w, "  gateway:  %s at %s\n", d.cfg.Gateway, d.cfg.GatewayURL)
	default:
		fmt.Fprintf(w, "  gateway:  %s\n", d.cfg.Gateway)
	}
	if !d.seed {
		fmt.Fprintf(w, "  demo data: none seeded: DATABASE_URL names a database in use (staff users, API clients or orders of its own; run `pitlane dev --demo` to seed demo orders and demo staff logins into it)\n")
	}
	if d.seed && d.sim != nil {
		note := "already present"
		switch {
		case d.seedErr != nil:
			note = "seeding failed: " + oneLine(d.seedErr.Error())
		case d.seeded > 0:
			note = fmt.Sprintf("%d seeded now", d.seeded)
		}
		fmt.Fprintf(w, "  demo orders (%s):\n", note)
		printDemo(ctx, w, d.svc)
	}
	printCheckoutLink(ctx, w, d.svc)
	switch {
	case !d.seed:
	case d.staffErr != nil:
		fmt.Fprintf(w, "  demo staff logins: seeding failed: %s\n", oneLine(d.staffErr.Error()))
	default:
		printStaff(w, d.staff)
	}
	fmt.Fprintf(w, "  Ctrl-C stops everything.\n\n")
}
