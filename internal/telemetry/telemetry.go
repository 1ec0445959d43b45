// Package telemetry builds the process's OpenTelemetry tracer provider: spans exported over
// OTLP/HTTP when an endpoint is configured (config.Config.OTLPTracesEndpoint, from the standard
// OTEL_EXPORTER_OTLP_ENDPOINT), and a no-op provider otherwise, whose spans record nothing and
// which has no exporter, so that nothing is sent anywhere.
//
// The provider is handed to what makes spans (web.Deps, payments.Config, gwtrace.Wrap) rather
// than installed globally, so that tests run side by side with providers of their own.
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ServiceName is the service.name of pitlane's spans unless OTEL_SERVICE_NAME says otherwise.
const ServiceName = "pitlane"

// Tracing is the process's tracer provider.
type Tracing struct {
	// Provider makes spans: the SDK's when exporting, a no-op one otherwise.
	Provider trace.TracerProvider
	sdk      *sdktrace.TracerProvider // nil when nothing is exported
}

// Start builds the provider. endpoint "" (tracing off): a no-op provider and no exporter. Else
// an SDK provider batching spans to endpoint over OTLP/HTTP, its resource naming the service
// (pitlane, or OTEL_SERVICE_NAME) and this replica (service.instance.id), plus
// OTEL_RESOURCE_ATTRIBUTES. The SDK itself reads the other standard variables: the sampler
// (OTEL_TRACES_SAMPLER, default: every trace, or as the caller's traceparent decided), batching
// (OTEL_BSP_*), and the exporter's headers, timeout, compression and certificates
// (OTEL_EXPORTER_OTLP_*). Export failures are logged as warnings; they never fail a request.
func Start(ctx context.Context, endpoint, replicaID string, logger *slog.Logger) (*Tracing, error) {
	if endpoint == "" {
		return &Tracing{Provider: noop.NewTracerProvider()}, nil
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// Later detectors win: our defaults first, then what the environment says.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(ServiceName), semconv.ServiceInstanceID(replicaID)),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// The SDK reports export failures through the global error handler (otherwise to the
	// standard logger); route them to ours.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing: export failed", "err", err)
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	logger.Info("tracing: exporting spans over OTLP/HTTP", "endpoint", redacted(endpoint))
	return &Tracing{Provider: tp, sdk: tp}, nil
}

// Exporting reports whether spans leave the process.
func (t *Tracing) Exporting() bool { return t.sdk != nil }

// Shutdown sends the spans still batched and stops the exporter (bounded by ctx). Call it after
// the server and the sweeper stopped, so their last spans go out too.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.sdk == nil {
		return nil
	}
	if err := t.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// redacted is the endpoint for a log line: without a password in its user info.
func redacted(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
