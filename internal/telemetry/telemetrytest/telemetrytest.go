// Package telemetrytest records spans in memory for tests (the SDK's in-memory exporter behind a
// synchronous processor, so a span is readable as soon as it ended) and reads them back.
package telemetrytest

import (
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Recorder is a tracer provider whose ended spans a test can read.
type Recorder struct {
	*sdktrace.TracerProvider
	exp *tracetest.InMemoryExporter
}

// New returns a recorder sampling every span; it is shut down when the test ends.
func New(t testing.TB) *Recorder {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	return &Recorder{TracerProvider: tp, exp: exp}
}

// Spans returns the spans ended so far, in the order they ended.
func (r *Recorder) Spans() tracetest.SpanStubs { return r.exp.GetSpans() }

// Trace returns the ended spans of one trace.
func (r *Recorder) Trace(id trace.TraceID) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range r.Spans() {
		if s.SpanContext.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// Named returns the spans called name.
func Named(spans tracetest.SpanStubs, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// One returns the one span called name, failing the test when there is not exactly one.
func One(t testing.TB, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	got := Named(spans, name)
	if len(got) != 1 {
		t.Fatalf("%d spans named %q, want 1; spans: %s", len(got), name, Names(spans))
	}
	return got[0]
}

// Names lists the spans' names, for failure messages.
func Names(spans tracetest.SpanStubs) string {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", ")
}

// Attr returns the value of a span's attribute as text ("" when absent).
func Attr(s tracetest.SpanStub, key attribute.Key) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

// ChildOf reports whether child's parent is parent.
func ChildOf(child, parent tracetest.SpanStub) bool {
	return child.Parent.SpanID() == parent.SpanContext.SpanID() && child.Parent.TraceID() == parent.SpanContext.TraceID()
}

// Mentions lists every place in the spans (attribute values, status texts, event attributes)
// where one of the values appears, as "span: key" lines: what a test that keeps amounts,
// contacts, codes and keys out of traces asserts is empty.
func Mentions(spans tracetest.SpanStubs, values ...string) []string {
	var out []string
	check := func(span, where, text string) {
		for _, v := range values {
			if v != "" && strings.Contains(text, v) {
				out = append(out, fmt.Sprintf("%s: %s carries %q", span, where, v))
			}
		}
	}
	for _, s := range spans {
		check(s.Name, "name", s.Name)
		check(s.Name, "status", s.Status.Description)
		for _, kv := range s.Attributes {
			check(s.Name, string(kv.Key), kv.Value.String())
		}
		for _, ev := range s.Events {
			for _, kv := range ev.Attributes {
				check(s.Name, ev.Name+"."+string(kv.Key), kv.Value.String())
			}
		}
	}
	return out
}
