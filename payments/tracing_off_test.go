package payments

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"
)

// TestTracingOffCostsNothing: with the no-op provider `pitlane serve` runs without an OTLP
// endpoint, a core operation's span costs no allocation and leaves the context as it was (a
// click on the hot order spent 5 % of its Go CPU on spans nobody recorded); with a provider
// that traces, the same call makes a span and carries the ids — the control that shows the
// measure would see a span being made.
func TestTracingOffCostsNothing(t *testing.T) {
	ctx := context.Background()
	off := NewService(nil, Config{TracerProvider: noop.NewTracerProvider()})
	on := NewService(nil, Config{TracerProvider: countingProvider{noop.NewTracerProvider()}})
	spanOf := func(s *Service) func() {
		return func() {
			c, span := s.startSpan(ctx, "payments.create", "", "order-1")
			c = s.traceSession(c, Session{ID: "00000000-0000-0000-0000-000000000001", OrderID: "order-1"})
			span.End()
			if s == off && c != ctx {
				t.Error("tracing off: the context changed")
			}
		}
	}
	if n := testing.AllocsPerRun(100, spanOf(off)); n != 0 {
		t.Errorf("tracing off: %.0f allocations per span, want 0", n)
	}
	if n := testing.AllocsPerRun(100, spanOf(on)); n == 0 {
		t.Error("control: a traced span allocated nothing; the measure is blind")
	}
	c, span := on.startSpan(ctx, "payments.create", "", "order-1")
	defer span.End()
	if _, order := TraceIDs(c); order != "order-1" {
		t.Errorf("tracing on: the context carries order %q, want order-1", order)
	}
}

// countingProvider is a provider that is not the no-op type: the core traces into it.
type countingProvider struct{ noop.TracerProvider }
