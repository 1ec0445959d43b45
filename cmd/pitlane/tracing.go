package main

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"pitlane/internal/config"
	"pitlane/internal/telemetry"
)

// tracingFlushTimeout bounds how long a stopping server waits for its last spans to reach the
// collector.
const tracingFlushTimeout = 5 * time.Second

// startTracing builds the tracer provider of a server process from OTEL_EXPORTER_OTLP_ENDPOINT
// (a no-op one without it), or uses given (tests: an in-memory exporter). stop flushes what is
// still batched; call it once the server and the sweeper have stopped.
func startTracing(ctx context.Context, cfg config.Config, logger *slog.Logger, given trace.TracerProvider) (tp trace.TracerProvider, stop func(), err error) {
	if given != nil {
		return given, func() {}, nil
	}
	t, err := telemetry.Start(ctx, cfg.OTLPTracesEndpoint, cfg.ReplicaID, logger)
	if err != nil {
		return nil, nil, err
	}
	return t.Provider, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout)
		defer cancel()
		if err := t.Shutdown(sctx); err != nil {
			logger.Warn("tracing: last spans not sent", "err", err)
		}
	}, nil
}
