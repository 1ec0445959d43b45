package gwtrace_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"pitlane/internal/telemetry/telemetrytest"
	"pitlane/payments/gateway/gwtrace"
)

// TestTransportSendsTraceparent: a request made inside a span carries that span's trace context
// in traceparent (the caller's request left untouched); one made outside any span carries none.
func TestTransportSendsTraceparent(t *testing.T) {
	t.Parallel()
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
	}))
	defer srv.Close()
	client := &http.Client{Transport: gwtrace.Transport(nil)}
	defer client.CloseIdleConnections()

	rec := telemetrytest.New(t)
	ctx, span := rec.Tracer("test").Start(context.Background(), "gateway.status")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	span.End()
	sc := span.SpanContext()
	if tp := <-got; tp != "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01" {
		t.Errorf("traceparent %q, want the span's %s/%s", tp, sc.TraceID(), sc.SpanID())
	}
	if req.Header.Get("traceparent") != "" {
		t.Error("the transport wrote into the caller's request")
	}

	req, _ = http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if tp := <-got; tp != "" {
		t.Errorf("a request outside any span sent traceparent %q", tp)
	}
}
