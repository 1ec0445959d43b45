package web_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"pitlane/internal/telemetry/telemetrytest"
	"pitlane/payments"
	"pitlane/web"
)

// TestServerSpans: each request is a server span named by its route that continues the
// caller's traceparent, with the status (5xx as an error) and the ids the route names; an
// unknown path is named by its method alone; health probes make no span. The query string
// (a checkout link's customer contact) is nowhere in the span.
func TestServerSpans(t *testing.T) {
	t.Parallel()
	rec := telemetrytest.New(t)
	e := web.New(web.Deps{Logger: slog.New(slog.DiscardHandler), TracerProvider: rec, Payments: offline(t)})
	serve := func(method, target string, header ...string) {
		r := httptest.NewRequest(method, target, nil)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		e.ServeHTTP(httptest.NewRecorder(), r)
	}

	_, caller := rec.Tracer("shop").Start(context.Background(), "shop backend")
	caller.End()
	sc := caller.SpanContext()
	// The database does not answer: the key cannot be checked, and the API answers 503.
	serve(http.MethodPost, "/api/v1/orders/o-77/payments?contact=secret.customer@example.com",
		"traceparent", "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", "Authorization", "Bearer pl_0123456789ab_"+strings.Repeat("0", 64))
	serve(http.MethodGet, "/healthz")
	serve(http.MethodGet, "/no/such/page")
	serve(http.MethodGet, "/login", "traceparent", "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01")

	spans := rec.Spans()
	api := telemetrytest.One(t, spans, "POST /api/v1/orders/:order_id/payments")
	if api.SpanKind != trace.SpanKindServer || api.Parent.SpanID() != sc.SpanID() || api.SpanContext.TraceID() != sc.TraceID() {
		t.Errorf("the API span does not continue the caller's trace: kind %v parent %v", api.SpanKind, api.Parent)
	}
	if api.Status.Code != codes.Error || telemetrytest.Attr(api, "http.response.status_code") != "503" ||
		telemetrytest.Attr(api, payments.AttrOrderID) != "o-77" || telemetrytest.Attr(api, "url.path") != "/api/v1/orders/o-77/payments" {
		t.Errorf("API span: status %v attributes %v", api.Status, api.Attributes)
	}
	if got := telemetrytest.Named(spans, "GET /healthz"); len(got) != 0 {
		t.Error("a health probe made a span")
	}
	if got := telemetrytest.One(t, spans, "GET"); telemetrytest.Attr(got, "http.response.status_code") != "404" || telemetrytest.Attr(got, "http.route") != "" {
		t.Errorf("unknown path span: %v", got.Attributes)
	}
	// An anonymous page does not continue a caller's trace: its visitor cannot force sampling or
	// pick the trace id that reaches the gateway.
	if login := telemetrytest.One(t, spans, "GET /login"); login.SpanContext.TraceID() == sc.TraceID() || login.Parent.IsValid() {
		t.Errorf("the sign-in page continued the visitor's traceparent: parent %v", login.Parent)
	}
	if leaks := telemetrytest.Mentions(spans, "secret.customer", "contact="); len(leaks) > 0 {
		t.Errorf("the query string reached a span: %v", leaks)
	}
}
