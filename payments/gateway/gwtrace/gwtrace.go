// Package gwtrace traces the calls a payments.Gateway makes, for OpenTelemetry, and carries the
// trace to the gateway. Like gwmetrics it is a decorator, so every adapter (reference gateway,
// Stripe, the fake in tests) is traced the same way, by the FailureKind the core acts on; and
// Transport puts the W3C trace context of each request into its `traceparent` header, so a
// gateway that traces too can join its side of the call to ours.
//
// Each call is one span "gateway.<op>" of kind client, a child of the core operation that made
// it, with the gateway's name, the session and order ids (payments.TraceIDs) and the gateway
// payment id. Never the amount, the idempotency key or an error's text: an error is recorded by
// its kind, the gateway's error code and the HTTP status.
package gwtrace

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"pitlane/payments"
)

// Span attributes of a gateway call (besides payments.AttrSessionID and AttrOrderID).
const (
	AttrGateway          = attribute.Key("pitlane.gateway")
	AttrOperation        = attribute.Key("pitlane.gateway.operation")
	AttrGatewayPaymentID = attribute.Key("pitlane.gateway_payment_id")
	// AttrOutcome is ok, or the failure kind: definitive, unknown, not_sent (as in the metrics).
	AttrOutcome   = attribute.Key("pitlane.gateway.outcome")
	AttrErrorCode = attribute.Key("pitlane.gateway.error_code")
	// AttrHTTPStatus is the gateway's HTTP status when a call failed with an answer.
	AttrHTTPStatus = attribute.Key("http.response.status_code")
)

// Gateway wraps another Gateway and makes a span of each call.
type Gateway struct {
	next   payments.Gateway
	tracer trace.Tracer
}

var _ payments.Gateway = (*Gateway)(nil)

// Wrap returns gw traced into tp (nil: the global provider).
func Wrap(gw payments.Gateway, tp trace.TracerProvider) *Gateway {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Gateway{next: gw, tracer: tp.Tracer("pitlane/gateway")}
}

// Unwrap returns the wrapped gateway.
func (g *Gateway) Unwrap() payments.Gateway { return g.next }

// Name implements payments.Gateway: the wrapped gateway's name.
func (g *Gateway) Name() string { return g.next.Name() }

func (g *Gateway) start(ctx context.Context, op, gatewayPaymentID string) (context.Context, trace.Span) {
	kv := []attribute.KeyValue{AttrGateway.String(g.next.Name()), AttrOperation.String(op)}
	sessionID, orderID := payments.TraceIDs(ctx)
	if sessionID != "" {
		kv = append(kv, payments.AttrSessionID.String(sessionID))
	}
	if orderID != "" {
		kv = append(kv, payments.AttrOrderID.String(orderID))
	}
	if gatewayPaymentID != "" {
		kv = append(kv, AttrGatewayPaymentID.String(gatewayPaymentID))
	}
	return g.tracer.Start(ctx, "gateway."+op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(kv...))
}

func end(span trace.Span, gatewayPaymentID string, err error) {
	defer span.End()
	if err == nil {
		span.SetAttributes(AttrOutcome.String("ok"))
		if gatewayPaymentID != "" {
			span.SetAttributes(AttrGatewayPaymentID.String(gatewayPaymentID))
		}
		return
	}
	kind := payments.FailureOf(err)
	span.SetAttributes(AttrOutcome.String(string(kind)))
	var ge *payments.GatewayError
	if errors.As(err, &ge) {
		if ge.Code != "" {
			span.SetAttributes(AttrErrorCode.String(ge.Code))
		}
		if ge.HTTPStatus != 0 {
			span.SetAttributes(AttrHTTPStatus.Int(ge.HTTPStatus))
		}
	}
	span.SetStatus(codes.Error, "gateway "+string(kind))
}

func (g *Gateway) Register(ctx context.Context, req payments.RegisterRequest) (payments.GatewayPayment, error) {
	ctx, span := g.start(ctx, "register", "")
	p, err := g.next.Register(ctx, req)
	end(span, p.ID, err)
	return p, err
}

func (g *Gateway) Status(ctx context.Context, id string) (payments.GatewayPayment, error) {
	ctx, span := g.start(ctx, "status", id)
	p, err := g.next.Status(ctx, id)
	end(span, "", err)
	return p, err
}

func (g *Gateway) FindByReference(ctx context.Context, ref string) ([]payments.GatewayPayment, error) {
	ctx, span := g.start(ctx, "find", "")
	ps, err := g.next.FindByReference(ctx, ref)
	span.SetAttributes(attribute.Int("pitlane.gateway.found", len(ps)))
	end(span, "", err)
	return ps, err
}

func (g *Gateway) Reverse(ctx context.Context, id, key string) (payments.GatewayPayment, error) {
	ctx, span := g.start(ctx, "reverse", id)
	p, err := g.next.Reverse(ctx, id, key)
	end(span, "", err)
	return p, err
}

func (g *Gateway) Refund(ctx context.Context, id, key string, amount int64, currency string) (payments.GatewayRefund, error) {
	ctx, span := g.start(ctx, "refund", id)
	r, err := g.next.Refund(ctx, id, key, amount, currency)
	end(span, "", err)
	return r, err
}

func (g *Gateway) RefundStatus(ctx context.Context, refundID string) (payments.GatewayRefund, error) {
	ctx, span := g.start(ctx, "refund_status", "")
	r, err := g.next.RefundStatus(ctx, refundID)
	end(span, "", err)
	return r, err
}

func (g *Gateway) FindRefund(ctx context.Context, id, key string) (payments.GatewayRefund, bool, error) {
	ctx, span := g.start(ctx, "find_refund", id)
	r, found, err := g.next.FindRefund(ctx, id, key)
	end(span, "", err)
	return r, found, err
}

// KeyRetention implements payments.Gateway: the wrapped gateway's.
func (g *Gateway) KeyRetention() time.Duration { return g.next.KeyRetention() }

// Transport returns base (nil: a private clone of http.DefaultTransport) sending the trace
// context of each request's context in the W3C `traceparent` (and `tracestate`) headers. The
// adapters' HTTP clients use it, so the header names the gateway span (Gateway above) the call
// belongs to. A request whose context carries no valid span context goes out unchanged: with
// tracing off the gateway sees no trace header at all.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport.(*http.Transport).Clone()
	}
	return &transport{base: base}
}

type transport struct{ base http.RoundTripper }

// propagator is the W3C Trace Context format alone: baggage is not sent to a gateway, whatever
// the process's global propagators are.
var propagator = propagation.TraceContext{}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !trace.SpanContextFromContext(r.Context()).IsValid() {
		return t.base.RoundTrip(r)
	}
	r = r.Clone(r.Context()) // a RoundTripper must not modify the caller's request
	propagator.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	return t.base.RoundTrip(r)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the wrapped transport.
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
