package payments

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing of the core. Every operation (create, claim, register, apply, check, cancel, refund,
// webhook, the sweeper's drive) is a span from Config.TracerProvider, named "payments.<op>",
// carrying the ids of the session and order it is about, so a trace of one request shows where
// its time went: waiting for a lock, in a transaction, or at the gateway (whose calls are spans
// of payments/gateway/gwtrace below these).
//
// Spans carry ids and error codes only. Never amounts, customer contacts, one-time codes, keys or
// error texts: traces leave the process for a collector that support staff and vendors read, and
// an error text can quote any of those (a conflict names the amount, a gateway error its body).

// Span attributes of the core. Other layers (the HTTP server span, the gateway spans) use the
// same keys so one query finds every span of a payment.
const (
	AttrSessionID = attribute.Key("pitlane.session_id")
	AttrOrderID   = attribute.Key("pitlane.order_id")
	// AttrErrorCode is the domain error code (errors.go) an operation failed with.
	AttrErrorCode = attribute.Key("pitlane.error_code")

	attrEventID   = attribute.Key("pitlane.gateway_event_id")
	attrEventType = attribute.Key("pitlane.gateway_event_type")
	attrLeaseLost = attribute.Key("pitlane.lease_lost") // a patrol's drive found its lease taken over
)

// tracerName is the instrumentation scope of the core's spans.
const tracerName = "pitlane/payments"

type traceIDsKey struct{}

type traceIDs struct{ session, order string }

func (ids traceIDs) attrs() []attribute.KeyValue {
	var kv []attribute.KeyValue
	if ids.session != "" {
		kv = append(kv, AttrSessionID.String(ids.session))
	}
	if ids.order != "" {
		kv = append(kv, AttrOrderID.String(ids.order))
	}
	return kv
}

// TraceIDs returns the session and order ids of the core operation running in ctx ("" for what
// is not known), so that spans made beside the core (the gateway decorator's) name them too.
func TraceIDs(ctx context.Context) (sessionID, orderID string) {
	ids, _ := ctx.Value(traceIDsKey{}).(traceIDs)
	return ids.session, ids.order
}

// newTracer is the core's tracer from tp; nil tp means the global provider (a no-op unless the
// process installed one). A no-op provider (telemetry's when nothing is exported, as in the web
// layer's tracing middleware) gives nil: tracing is off, and the core makes no spans at all.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if _, off := tp.(noop.TracerProvider); off {
		return nil
	}
	return tp.Tracer(tracerName)
}

// offSpan is what startSpan gives with tracing off: ending it, or naming anything on it, does
// nothing.
var offSpan trace.Span = noop.Span{}

// startSpan starts the span of one core operation about a session and/or an order ("" for an id
// not known yet; the ids of an enclosing operation are inherited). Call it at the top of the
// operation and end the span when it returns:
//
//	ctx, span := s.startSpan(ctx, "sweep.drive", sess.ID, sess.OrderID)
//	defer span.End()
//
// With tracing off it returns ctx as it is and a span that does nothing: no span, no ids in the
// context, nothing allocated. A click on the hot order (one round trip) spent 5 % of its Go CPU
// on the spans it made for nobody (docs/performance.md, the sixth session).
func (s *Service) startSpan(ctx context.Context, name, sessionID, orderID string) (context.Context, trace.Span) {
	if s.tracer == nil {
		return ctx, offSpan
	}
	ids, _ := ctx.Value(traceIDsKey{}).(traceIDs)
	if sessionID != "" {
		ids.session = sessionID
	}
	if orderID != "" {
		ids.order = orderID
	}
	ctx, span := s.tracer.Start(ctx, name, trace.WithAttributes(ids.attrs()...))
	return context.WithValue(ctx, traceIDsKey{}, ids), span
}

// traceSession names the session (and its order) of the operation in ctx once it has been read:
// on the current span, and for the spans started below it. Nothing with tracing off.
func (s *Service) traceSession(ctx context.Context, sess Session) context.Context {
	if s.tracer == nil {
		return ctx
	}
	ids := traceIDs{session: sess.ID, order: sess.OrderID}
	trace.SpanFromContext(ctx).SetAttributes(ids.attrs()...)
	return context.WithValue(ctx, traceIDsKey{}, ids)
}

// traceError notes on the span of ctx that the operation failed: its domain error code always,
// and an error status for what is not an answer to the caller's input (internal errors, a
// dependency or lock that timed out). A conflict or an invalid input is the operation working.
func traceError(ctx context.Context, err error) {
	span := trace.SpanFromContext(ctx)
	if err == nil || !span.IsRecording() {
		return
	}
	code := ErrorCode(err)
	span.SetAttributes(AttrErrorCode.String(code))
	if code == EINTERNAL || code == EUNAVAIL {
		span.SetStatus(codes.Error, code)
	}
}
