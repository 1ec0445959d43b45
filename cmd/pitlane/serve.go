package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/config"
	"pitlane/web"
)

// shutdownGrace bounds graceful shutdown: in-flight requests get this long to finish.
const shutdownGrace = 15 * time.Second

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
	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	return run(ctx, cfg, pool, env.Logger, nil)
}

// run is the server process shared by serve and dev: it listens on HTTP_ADDR, serves until ctx
// is canceled and then shuts down gracefully. ready (optional) is called with the console's
// URL once the listener is bound, so a caller that prints it never advertises a dead address.
//
// Services that need the final public URL (return URLs, webhook URLs) must be built after
// the listener is bound: with HTTP_ADDR port 0 the real port is known only then.
func run(ctx context.Context, cfg config.Config, pool *pgxpool.Pool, logger *slog.Logger, ready func(url string)) error {
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	if strings.HasSuffix(cfg.PublicBaseURL, ":0") {
		cfg.PublicBaseURL = "http://" + ln.Addr().String()
	}

	if len(cfg.SecretKey) == 0 {
		if cfg.SecretKey, err = derivedSecret(ctx, pool); err != nil {
			ln.Close()
			return err
		}
		logger.Warn("SECRET_KEY is unset: using a key derived from the database's identity; set SECRET_KEY (e.g. `openssl rand -hex 32`) in production")
	}

	e := web.New(web.Deps{
		Logger:    logger,
		DB:        pool,
		ReplicaID: cfg.ReplicaID,
		SecretKey: cfg.SecretKey,
	})
	srv := &http.Server{
		Handler:           e,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("serving", "url", cfg.PublicBaseURL, "addr", ln.Addr().String(), "replica", cfg.ReplicaID)
	if ready != nil {
		ready(cfg.PublicBaseURL)
	}

	select {
	case err := <-served:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down", "cause", context.Cause(ctx))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("graceful shutdown: %w", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause // e.g. dev's private PostgreSQL exited under us
	}
	return nil
}
