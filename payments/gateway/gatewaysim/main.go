package gatewaysim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"
)

// DefaultAPIKey is the key `pitlane gatewaysim` accepts when none is configured.
const DefaultAPIKey = "sim_test_key"

// Main implements `pitlane gatewaysim`: it serves a simulator until ctx is canceled, then stops
// gracefully. args are the command's arguments (without the command name). Flags fall back to
// the environment variables the service reads, so one environment configures both sides.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gatewaysim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: pitlane gatewaysim [flags]\n\nServes a simulated reference gateway (gateway-api.md) with the /_sim control API.\n\nflags:")
		fs.PrintDefaults()
	}
	var (
		addr          = fs.String("addr", "127.0.0.1:8090", "listen address; loopback by default: the /_sim/ control API has no auth (--addr :8090 to listen on every interface)")
		apiKey        = fs.String("api-key", envOr("GATEWAY_API_KEY", DefaultAPIKey), "bearer key clients must send (env GATEWAY_API_KEY)")
		webhookURL    = fs.String("webhook-url", os.Getenv("GATEWAY_WEBHOOK_URL"), "where to POST signed payment.updated events; empty: none (env GATEWAY_WEBHOOK_URL)")
		webhookSecret = fs.String("webhook-secret", os.Getenv("GATEWAY_WEBHOOK_SECRET"), "webhook signing secret (env GATEWAY_WEBHOOK_SECRET)")
		publicURL     = fs.String("public-url", "", "base of confirmation_url as customers reach it; empty: the request's host")
		captureDelay  = fs.Duration("capture-delay", 2*time.Second, "time from approval to capture")
		expireAfter   = fs.Duration("expire-after", 30*time.Minute, "pending payments expire after this; 0: never")
		tick          = fs.Duration("tick", 250*time.Millisecond, "how often time rules (capture, expiry) are applied")
		ignoreKeys    = fs.Bool("ignore-idempotency-keys", false, "behave like a gateway that cannot be trusted with idempotency keys")
		whDuplicate   = fs.Int("webhook-duplicate", 0, "send every webhook this many extra times")
		whDelay       = fs.Duration("webhook-delay", 0, "hold every webhook this long before sending it")
		whReorder     = fs.Bool("webhook-reorder", false, "send a payment's webhooks newest first once it is final")
		statePath     = fs.String("state", "", "keep payments, refunds and idempotency keys in this file across restarts (read at start, written at stop); empty: memory only")
		verbose       = fs.Bool("v", false, "log every call")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("gatewaysim: unexpected arguments %q", fs.Args())
	}
	if *webhookURL != "" && *webhookSecret == "" {
		return errors.New("gatewaysim: --webhook-url needs --webhook-secret (or GATEWAY_WEBHOOK_SECRET)")
	}
	// The webhook faults shape webhooks: without a URL none are sent, and a fault asked for
	// would be dropped without a word (a test run would believe it injected it).
	if *webhookURL == "" && (*whDuplicate != 0 || *whDelay != 0 || *whReorder) {
		return errors.New("gatewaysim: --webhook-duplicate, --webhook-delay and --webhook-reorder need --webhook-url (or GATEWAY_WEBHOOK_URL): without it no webhooks are sent")
	}
	if *whDuplicate < 0 || *whDelay < 0 {
		return errors.New("gatewaysim: --webhook-duplicate and --webhook-delay cannot be negative")
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("gatewaysim: listen: %w", err)
	}
	sim := New(Options{
		APIKey:        *apiKey,
		WebhookURL:    *webhookURL,
		WebhookSecret: *webhookSecret,
		CaptureDelay:  *captureDelay,
		ExpireAfter:   *expireAfter,
		PublicURL:     *publicURL,
		Logger:        logger,
		TickInterval:  *tick,
	})
	if *statePath != "" {
		if err := sim.LoadState(*statePath); err != nil {
			_ = sim.Close()
			_ = ln.Close()
			return err
		}
	}
	sim.SetIgnoreIdempotencyKeys(*ignoreKeys)
	sim.SetWebhookFaults(WebhookFaults{Duplicate: *whDuplicate, Delay: *whDelay, Reorder: *whReorder})

	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "gatewaysim listening on http://%s\n", ln.Addr())

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	select {
	case err := <-serveErr:
		_ = sim.Close()
		return fmt.Errorf("gatewaysim: serve: %w", err)
	case <-ctx.Done():
	}
	// Close the simulator first: it releases parked calls (which answer 503), so Shutdown does
	// not wait on a call someone paused and forgot.
	_ = sim.Close()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	if err := srv.Shutdown(shutdownCtx); err != nil {
		errs = append(errs, fmt.Errorf("gatewaysim: shutdown: %w", err))
	} else {
		<-serveErr // http.ErrServerClosed
	}
	if *statePath != "" { // the handlers have returned: nothing changes it any more
		errs = append(errs, sim.SaveState(*statePath))
	}
	return errors.Join(errs...)
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
