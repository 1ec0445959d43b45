package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"pitlane/access"
	"pitlane/handlers"
	"pitlane/internal/config"
	"pitlane/live"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
	"pitlane/web"
)

// shutdownGrace bounds graceful shutdown: in-flight requests get this long to finish, or a
// gateway call's timeout and a little more when that is longer (shutdownGraceFor).
const shutdownGrace = 15 * time.Second

// shutdownGraceFor is how long requests in flight get to finish at a stop: at least one gateway
// call (GATEWAY_TIMEOUT) and the short transactions around it, and never less than shutdownGrace.
func shutdownGraceFor(gatewayTimeout time.Duration) time.Duration {
	return max(shutdownGrace, gatewayTimeout+5*time.Second)
}

// leaseReleaseBound is RunSweeper's own bound on its last writes at a stop (leases, the
// reconciliation leadership and the heartbeat given back).
const leaseReleaseBound = 5 * time.Second

// patrolStopBoundFor is how long a stop waits for the patrol: a claim on the wire is cut a
// gateway timeout after the stop, then the patrol gives back what it holds (leaseReleaseBound),
// and a second more. A patrol still running then waits on a database that does not answer (a
// network cut, a hung host): nothing it would write can be written, its leases lapse on their
// own, and the replica exits without it rather than be SIGKILLed past TimeoutStopSec.
func patrolStopBoundFor(gatewayTimeout time.Duration) time.Duration {
	return gatewayTimeout + leaseReleaseBound + time.Second
}

// poolCloseBound is how long a stop waits for the pool's connections to be handed back and
// closed (each with a Terminate message). Past it something still waits on a silent database.
const poolCloseBound = 5 * time.Second

// waitStopped waits for done at most bound; it reports whether done came.
func waitStopped(done <-chan struct{}, bound time.Duration) bool {
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// closePool closes the pool, waiting at most poolCloseBound: pgxpool's Close waits for every
// connection in use, and one waiting on a database that does not answer would hold the stop
// until it did. It reports whether the pool closed.
func closePool(pool *pgxpool.Pool, logger *slog.Logger) bool {
	closed := make(chan struct{})
	go func() { defer close(closed); pool.Close() }()
	if !waitStopped(closed, poolCloseBound) {
		logger.Error("stop: database connections still in use after the bound (the database does not answer?): exiting without closing them",
			"bound", poolCloseBound)
		return false
	}
	return true
}

// runServe: `pitlane serve`.
func runServe(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 {
		return Usagef("serve takes no arguments (configuration comes from the environment)")
	}
	cfg, err := env.Config()
	if err != nil {
		return err
	}
	if err := cfg.RequireDatabase("serve"); err != nil {
		return err
	}
	// The secret before the gateway: the contract has serve refuse to start without SECRET_KEY
	// and name it, and a configuration missing both is told about the contract's one first.
	if err := cfg.RequireSecret("serve"); err != nil {
		return err
	}
	if err := checkGateway(cfg, "serve"); err != nil {
		return err
	}
	warnLocalLinks(env, cfg)
	warnDevSettings(env, cfg)
	if path := env.Getenv("PITLANE_CPU_PROFILE"); path != "" {
		// A Go CPU profile of the whole process until it stops (make bench's BENCH_PROFILE sets
		// it for the replica under load; docs/performance.md). Not a setting of the product.
		stop, err := startCPUProfile(path)
		if err != nil {
			return err
		}
		defer stop()
	}
	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	err = run(ctx, cfg, pool, env.Logger, nil)
	// Last: the server, the sweeper (its leases given back) and the tracer have stopped, so
	// nothing uses a connection any more; Close ends each one with a Terminate message (unless
	// the database stopped answering: then the process exits without waiting for it).
	if closePool(pool, env.Logger) {
		env.Logger.Info("stopped: database pool closed", "replica", cfg.ReplicaID)
	}
	return err
}

// warnLocalLinks: serve listening on every interface without PUBLIC_BASE_URL gives customers
// checkout links and the gateway return URLs on localhost (config's default), which no one else
// reaches: said at the start, as an unset MERCHANT_NAME is (an outside review: it was silent).
// dev's localhost is right, and a host named in HTTP_ADDR is the operator's own choice.
func warnLocalLinks(env *Env, cfg config.Config) {
	if env.Getenv("PUBLIC_BASE_URL") != "" {
		return
	}
	if host, _, err := net.SplitHostPort(cfg.HTTPAddr); err == nil && (host == "" || net.ParseIP(host).IsUnspecified()) {
		env.Logger.Warn("PUBLIC_BASE_URL is unset while HTTP_ADDR listens on every interface: checkout links and the gateway's return URLs point at localhost; set PUBLIC_BASE_URL to the address customers reach",
			"http_addr", cfg.HTTPAddr, "public_base_url", cfg.PublicBaseURL)
	}
}

// warnDevSettings: settings that suit `make run` on a laptop and not a service customers pay
// through, said at the start (an outside review: serve took them silently). Each is a warning,
// not a refusal: a staging host behind a VPN may mean them.
func warnDevSettings(env *Env, cfg config.Config) {
	if u, err := url.Parse(cfg.PublicBaseURL); err == nil && u.Scheme == "http" && env.Getenv("PUBLIC_BASE_URL") != "" {
		if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
			env.Logger.Warn("PUBLIC_BASE_URL is plain http on a host others reach: staff session cookies go without Secure, no HSTS, and customers pay over an unencrypted page; use https",
				"public_base_url", cfg.PublicBaseURL)
		}
	}
	for _, n := range cfg.TrustedProxies {
		if ones, _ := n.Mask.Size(); ones == 0 {
			env.Logger.Warn("TRUSTED_PROXIES trusts every address: any client names its own in X-Forwarded-For, and the per-address sign-in throttle counts what it names; list the proxies themselves",
				"range", n.String())
		}
	}
	if cfg.GatewayAPIKey == gatewaysim.DefaultAPIKey {
		env.Logger.Warn("GATEWAY_API_KEY is the gateway simulator's key: payments go to a simulator, not a gateway")
	}
}

// run is the server process shared by serve and dev: it listens on HTTP_ADDR, serves until ctx
// is canceled and then shuts down gracefully. ready (optional) is called with the console's
// URL once the listener is bound, so a caller that prints it never advertises a dead address.
func run(ctx context.Context, cfg config.Config, pool *pgxpool.Pool, logger *slog.Logger, ready func(url string)) error {
	return serveWith(ctx, cfg, pool, logger, serveOptions{ready: ready})
}

// httpServer is the server every listener of ours runs: bounded time to send the headers and
// the body (a slow client cannot hold a connection and a goroutine forever), to write the
// answer (long enough for a request that calls the gateway a few times, each bounded by
// GATEWAY_TIMEOUT; web.WriteMargin past a request's own bound, web.RequestTimeoutFor, so its 503 is
// written), to keep an idle connection, and bounded header size (the default is 1 MiB; nothing
// of ours needs more than a few KiB).
func httpServer(h http.Handler, cfg config.Config, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      web.RequestTimeoutFor(cfg.GatewayTimeout) + web.WriteMargin,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// listenURL is where the live listener connects: LISTEN_DATABASE_URL or DATABASE_URL, or the
// pool's own connection string when the caller built the pool without either (tests).
func listenURL(cfg config.Config, pool *pgxpool.Pool) string {
	if u := cfg.ListenURL(); u != "" {
		return u
	}
	return pool.Config().ConnString()
}

// maxHeaderBytes bounds a request's header block (cookies, a bearer key, the CSRF header).
const maxHeaderBytes = 64 << 10

// serveMetrics serves /metrics on METRICS_ADDR (its own listener, so operators can keep it off
// the public port); stop shuts it down.
func serveMetrics(cfg config.Config, metrics *web.Metrics, logger *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on METRICS_ADDR %s: %w", cfg.MetricsAddr, err)
	}
	srv := httpServer(metrics.Router(logger), cfg, logger)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("serving metrics", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			logger.Warn("metrics listener shutdown", "err", err)
		}
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Warn("metrics listener", "err", err)
		}
	}, nil
}

// serveOptions are the points where dev hooks into the server process.
type serveOptions struct {
	// ready is called with the console's URL once everything below is running.
	ready func(url string)
	// prepare runs once the listener is bound and PUBLIC_BASE_URL is final, before the services
	// are built from cfg: dev starts its gateway simulator here (it needs our webhook URL) and
	// points cfg at it. stop runs after the server and the sweeper have stopped.
	prepare func(ctx context.Context, cfg *config.Config) (stop func(), err error)
	// started runs once the server serves and the sweeper runs (dev seeds its demo data).
	started func(ctx context.Context, cfg config.Config, svc *payments.Service) error
	// tracing replaces the tracer provider built from OTEL_* (tests: an in-memory exporter).
	tracing trace.TracerProvider
	// clock is given the database clock once it is made, before ready (tests wait for its first
	// read, as /readyz does, instead of polling).
	clock func(*payments.DatabaseClock)
	// draining is called when SHUTDOWN_DRAIN's wait begins, with a function that ends it now
	// (tests: no waiting out the drain's real time).
	draining func(end func())
}

// serveWith is run with hooks. Services that need the final public URL (return URLs, webhook
// URLs) are built after the listener is bound: with HTTP_ADDR port 0 the real port is known only
// then. Every server has its payment service: without a usable gateway configuration it does
// not start (serve checks it before opening the database and exits 2; a direct caller gets the
// same error here).
func serveWith(ctx context.Context, cfg config.Config, pool *pgxpool.Pool, logger *slog.Logger, opts serveOptions) error {
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	if strings.HasSuffix(cfg.PublicBaseURL, ":0") {
		cfg.PublicBaseURL = "http://" + ln.Addr().String()
	}

	if err := cfg.RequireSecret("serve"); err != nil { // serve and dev check it first; this is for direct callers
		ln.Close()
		return err
	}

	if opts.prepare != nil {
		stop, err := opts.prepare(ctx, &cfg)
		if err != nil {
			ln.Close()
			return err
		}
		defer stop()
	}

	tp, stopTracing, err := startTracing(ctx, cfg, logger, opts.tracing)
	if err != nil {
		ln.Close()
		return err
	}
	defer stopTracing() // deferred before the server and the sweeper stop: runs after them

	metrics := web.NewMetrics()
	// Every replica's times are the database's (payments.DatabaseClock): a lease or an expiry
	// one replica writes and another compares means the same instant to both, whatever their
	// hosts' clocks say. Read at once and every clockSyncEvery until the server stops; the
	// patrol starts and /readyz answers ready once it has been read (a replica may start
	// before its database is reachable).
	clock := payments.NewDatabaseClock(nil)
	if opts.clock != nil {
		opts.clock(clock)
	}
	metrics.ObserveHostClock(clock.HostOffset)
	clockCtx, stopClock := context.WithCancel(context.WithoutCancel(ctx))
	clocked := make(chan struct{})
	go func() {
		defer close(clocked)
		clock.Run(clockCtx, pool, clockSyncEvery, logger.With("component", "clock"))
	}()
	defer func() {
		stopClock()
		<-clocked
	}()
	svc, verifier, err := newService(cfg, pool, clock, logger, metrics, tp)
	if err != nil {
		ln.Close()
		return err
	}
	if verifier == nil {
		logger.Warn("GATEWAY_WEBHOOK_SECRET is unset: every gateway webhook is refused; payments are still settled by the sweeper")
	}

	// The live console's listener: one per replica, on a connection of its own (LISTEN does not
	// survive pgbouncer's transaction mode: LISTEN_DATABASE_URL points past it). It stops after
	// the HTTP server; its streams end when shutdown starts (RegisterOnShutdown below).
	hub := live.New(live.Config{ConnString: listenURL(cfg, pool), Name: cfg.ReplicaID, Logger: logger})
	liveCtx, stopLive := context.WithCancel(context.WithoutCancel(ctx))
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		hub.Run(liveCtx)
	}()
	defer func() {
		stopLive()
		<-listened
	}()

	if cfg.MerchantName == "" {
		logger.Warn("MERCHANT_NAME is unset: checkout pages name the merchant by the public host", "merchant", cfg.Merchant())
	}
	https := strings.HasPrefix(cfg.PublicBaseURL, "https://")
	unready := make(chan struct{}) // closed when the stop begins: /readyz answers 503 "stopping"
	e := web.New(web.Deps{
		Logger:    logger,
		DB:        pool,
		ReplicaID: cfg.ReplicaID,
		SecretKey: cfg.SecretKey,
		// Rotation: older (or, while rolling out, newer) secrets still verify, never sign.
		SecretKeyFallbacks: cfg.SecretKeyFallbacks,
		// Cookies marked Secure only reach an https origin, and HSTS only makes sense on one:
		// set exactly when browsers use one.
		SecureCookies:      https,
		ConsoleIdleTimeout: cfg.ConsoleIdleTimeout,
		SessionClock:       clock.Now, // the idle timeout's last request, stamped and read by any replica
		ClockSynced:        clock.Synced(),
		Stopping:           unready,
		HSTS:               https,
		TrustedProxies:     cfg.TrustedProxies,
		Payments:           svc,
		Access:             access.New(pool, clock), // built whatever the gateway: the console signs people in anyway
		RequestTimeout:     web.RequestTimeoutFor(cfg.GatewayTimeout),
		Idempotency:        payments.IdempotencyConfig{StaleAfter: payments.StaleAfterFor(cfg.GatewayTimeout)},
		Webhooks:           handlers.WebhookConfig{Verifier: verifier},
		Metrics:            metrics,
		MetricsElsewhere:   cfg.MetricsAddr != "",
		MerchantName:       cfg.Merchant(),
		TracerProvider:     tp,
		Live:               hub,
	})
	srv := httpServer(e, cfg, logger)
	// The requests' base context: cut with web.ErrStopping when the stop's grace runs out, so
	// each request still in flight answers 503 (requestBound) before the server closes.
	stopping, cutRequests := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cutRequests(nil)
	srv.BaseContext = func(net.Listener) context.Context { return stopping }
	// Shutdown waits for connections to go idle, which a live stream never does by itself:
	// closing the hub ends every stream (the browsers reconnect elsewhere) and refuses new ones.
	srv.RegisterOnShutdown(hub.Close)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("serving", "url", cfg.PublicBaseURL, "addr", ln.Addr().String(), "replica", cfg.ReplicaID)
	if cfg.MetricsAddr != "" {
		stop, err := serveMetrics(cfg, metrics, logger)
		if err != nil {
			_ = srv.Close()
			return err
		}
		defer stop()
	}

	// The sweeper stops after the HTTP server (requests in flight may still be creating sessions
	// it would look after) and gives back its leases on the way out.
	sweepCtx, stopSweep := context.WithCancel(context.WithoutCancel(ctx))
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		select { // leases are taken and compared on the database's clock: not before it is read
		case <-clock.Synced():
		case <-sweepCtx.Done():
			return
		}
		// Nor before the schema is this binary's (a replica started before `pitlane migrate`
		// answers /readyz 503 and must not act meanwhile either).
		if !waitMigrated(sweepCtx, pool, logger) {
			return
		}
		svc.RunSweeper(sweepCtx, cfg.SweepInterval) // releases this replica's leases when it stops
	}()
	// Waited for at most patrolStopBoundFor (once: this defer covers the early returns).
	stopPatrol := sync.OnceFunc(func() {
		stopSweep()
		if bound := patrolStopBoundFor(cfg.GatewayTimeout); !waitStopped(swept, bound) {
			logger.Error("stop: the patrol had not stopped after the bound (the database does not answer?): exiting without it; its leases lapse on their own",
				"bound", bound)
		}
	})
	defer stopPatrol()

	if opts.started != nil {
		if err := opts.started(ctx, cfg, svc); err != nil {
			logger.Error("start-up step failed", "err", err)
		}
	}
	if opts.ready != nil {
		opts.ready(cfg.PublicBaseURL)
	}

	select {
	case err := <-served:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down", "cause", context.Cause(ctx))
	// Not ready from now on, and, for SHUTDOWN_DRAIN, still serving: the balancer learns it
	// from /readyz and stops sending new requests here before the listener closes (closed at
	// once, a request its balancer routed here meanwhile found the port refused).
	close(unready)
	// A stop asked for (a signal: Canceled) drains; one forced on it (dev's private PostgreSQL
	// gone) has nothing to drain for (a review).
	if drain := cfg.ShutdownDrain; drain > 0 && errors.Is(context.Cause(ctx), context.Canceled) {
		logger.Info("draining: /readyz answers 503 while the balancer stops sending requests here", "drain", drain)
		end := make(chan struct{})
		if opts.draining != nil {
			opts.draining(sync.OnceFunc(func() { close(end) }))
		}
		wait := time.NewTimer(drain)
		select {
		case <-wait.C:
		case <-end:
		case err := <-served:
			wait.Stop()
			return fmt.Errorf("http server: %w", err)
		}
		wait.Stop()
	}
	grace := shutdownGraceFor(cfg.GatewayTimeout)
	// At the grace's end the requests still running are cut (web.ErrStopping) and answer 503
	// with Retry-After; they get web.WriteMargin to write it (their records' and answer's
	// graces), as a request cut at its own bound does. What they started is safe: a session left
	// Registering is the patrol's, an idempotency key in progress goes stale.
	cut := time.AfterFunc(grace, func() {
		logger.Warn("shutdown grace ran out: cutting the requests still in flight (each answers 503)", "grace", grace)
		cutRequests(web.ErrStopping)
	})
	defer cut.Stop()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+web.WriteMargin)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Still not answered: closed. The stop itself goes on as asked (exit 0): systemd would
		// mark the unit failed otherwise.
		logger.Warn("shutdown: requests still unanswered after the grace and the write margin: closing their connections", "err", err)
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	stopPatrol()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause // e.g. dev's private PostgreSQL exited under us
	}
	return nil
}

// startCPUProfile writes a CPU profile to path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("PITLANE_CPU_PROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("PITLANE_CPU_PROFILE: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
