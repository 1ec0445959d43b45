package web

import (
	"strings"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"pitlane/payments"
)

// untraced are the routes that get no span: balancers probe health and Prometheus scrapes every
// few seconds, and a trace of each would bury the requests worth looking at (the request log
// leaves the successful probes out for the same reason).
var untraced = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// tracing makes one server span per request (OpenTelemetry; there is no otelecho in the module
// proxy this project uses, and this is all of it we need). It continues a trace the caller sent
// in `traceparent` (the JSON API's routes only), is named by the route ("POST /api/v1/orders/:order_id/payments"), and puts
// its context into the request, so the core's spans and the gateway's below it share the trace.
//
// Attributes: method, route, path and status, the client's address (as the sign-in throttle
// sees it), and the session or order id the route names. Never the query string (a checkout
// link carries the customer's contact), headers, cookies or bodies.
//
// With tracing off (the no-op provider telemetry.Start gives without an endpoint) it does
// nothing at all: not even a caller's traceparent is taken up, so none reaches the gateway and
// no log line names a trace.
func tracing(tp trace.TracerProvider) echo.MiddlewareFunc {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if _, off := tp.(noop.TracerProvider); off {
		return func(next echo.HandlerFunc) echo.HandlerFunc { return next }
	}
	tracer := tp.Tracer("pitlane/web")
	prop := propagation.TraceContext{}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			route := c.Path() // Echo routes before it runs this middleware (Use, not Pre)
			if untraced[route] {
				return next(c)
			}
			req := c.Request()
			ctx := req.Context()
			if strings.HasPrefix(route, "/api/") {
				// Only the API's callers (services with keys) continue their trace here. An
				// anonymous page's visitor could otherwise force the sampling of its own requests
				// (parentbased samplers follow the parent's flag) and choose the trace id that
				// reaches the gateway (an outside review).
				ctx = prop.Extract(ctx, propagation.HeaderCarrier(req.Header))
			}
			name := req.Method
			attrs := []attribute.KeyValue{
				semconv.HTTPRequestMethodKey.String(req.Method),
				semconv.URLPath(req.URL.Path),
				semconv.ClientAddress(c.RealIP()),
			}
			if route != "" {
				name += " " + route
				attrs = append(attrs, semconv.HTTPRoute(route))
			}
			attrs = append(attrs, routeIDs(c, route)...)
			ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
			defer span.End()
			c.SetRequest(req.WithContext(ctx))

			err := next(c)
			// The request logger inside has handed any error to the error handler already, so
			// the response's status is the one the client gets.
			status := c.Response().Status
			span.SetAttributes(semconv.HTTPResponseStatusCode(status))
			if status >= 500 {
				span.SetStatus(codes.Error, "") // the error handler logged the cause; no text here
			}
			return err
		}
	}
}

// routeIDs are the ids a route names: the order of /…/:order_id routes, the payment (session) of
// the API's and the console's /payments/:id routes. Other :id parameters (users, cases, refunds)
// are not payments.
func routeIDs(c echo.Context, route string) []attribute.KeyValue {
	var kv []attribute.KeyValue
	if id := c.Param("order_id"); id != "" {
		kv = append(kv, payments.AttrOrderID.String(id))
	}
	if strings.HasPrefix(route, "/api/v1/payments/:id") || strings.HasPrefix(route, "/payments/:id") {
		if id := c.Param("id"); id != "" {
			kv = append(kv, payments.AttrSessionID.String(id))
		}
	}
	return kv
}
