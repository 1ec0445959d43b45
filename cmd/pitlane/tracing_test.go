package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/internal/telemetry/telemetrytest"
	"pitlane/internal/testdb"
	"pitlane/internal/testlog"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
	"pitlane/payments/gateway/gwtrace"
)

// tracedGateway is the reference-gateway simulator behind a server that keeps the traceparent
// header of every registration it receives.
type tracedGateway struct {
	url string
	mu  sync.Mutex
	got []string
}

func newTracedGateway(t *testing.T) *tracedGateway {
	t.Helper()
	sim := gatewaysim.New(gatewaysim.Options{APIKey: "gw-test-key"})
	g := &tracedGateway{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/payments" {
			g.mu.Lock()
			g.got = append(g.got, r.Header.Get("traceparent"))
			g.mu.Unlock()
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		sim.Close() //nolint:errcheck
	})
	g.url = srv.URL
	return g
}

func (g *tracedGateway) registrations() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.got...)
}

// tracingBench is a database with an API key, and the settings of a server on a free port in
// front of a traced gateway (no OTEL_* variable set).
func tracingBench(t *testing.T) (*pgxpool.Pool, *tracedGateway, config.Config, string) {
	t.Helper()
	pool := testdb.New(t)
	gw := newTracedGateway(t)
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "GATEWAY_URL": gw.url, "GATEWAY_API_KEY": "gw-test-key", "SECRET_KEY": strings.Repeat("s", 32)}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	_, apiKey, err := access.New(pool, nil).CreateAPIClient(context.Background(), payments.Staff{Email: "test@example.com", Role: "admin"}, "shop")
	if err != nil {
		t.Fatal(err)
	}
	return pool, gw, cfg, apiKey
}

// createPayment creates a payment through the API of a running server and returns its id. A
// caller's traceparent goes with the request when one is given.
func createPayment(t *testing.T, base, apiKey, orderID, body, traceparent string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/orders/"+orderID+"/payments", strings.NewReader(body))
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "trace-test-"+orderID)
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create payment: %d %v %+v", resp.StatusCode, err, p)
	}
	return p.ID
}

// TestTraceFromAPIToGateway: a Create through the real server is one trace: the HTTP server
// span, the core's create with claim and register below it, and the gateway call below
// register, each naming the order and the session; the gateway receives a traceparent of that
// trace naming the gateway call's span; the request's log line names the trace. No span
// carries the API key, the gateway key, the amount or the customer's contact.
func TestTraceFromAPIToGateway(t *testing.T) {
	t.Parallel()
	pool, gw, cfg, apiKey := tracingBench(t)
	rec := telemetrytest.New(t)
	var logs testlog.Buffer
	base, stop := startServeWith(t, cfg, pool, slog.New(slog.NewJSONHandler(&logs, nil)), serveOptions{tracing: rec})
	id := createPayment(t, base, apiKey, "trace-order-1", `{"amount":4217,"currency":"EUR","customer_contact":"trace.customer@example.com"}`, "")
	if err := stop(); err != nil { // every span has ended once the server stopped
		t.Fatal(err)
	}

	server := telemetrytest.One(t, rec.Spans(), "POST /api/v1/orders/:order_id/payments")
	spans := rec.Trace(server.SpanContext.TraceID())
	create := telemetrytest.One(t, spans, "payments.create")
	claim := telemetrytest.One(t, spans, "payments.claim")
	register := telemetrytest.One(t, spans, "payments.register")
	call := telemetrytest.One(t, spans, "gateway.register")
	if server.SpanKind != trace.SpanKindServer || call.SpanKind != trace.SpanKindClient {
		t.Errorf("kinds: server span %v, gateway span %v", server.SpanKind, call.SpanKind)
	}
	for _, c := range []struct{ child, parent string }{
		{"payments.create", server.Name}, {"payments.claim", "payments.create"},
		{"payments.register", "payments.create"}, {"gateway.register", "payments.register"},
	} {
		if !telemetrytest.ChildOf(telemetrytest.One(t, spans, c.child), telemetrytest.One(t, spans, c.parent)) {
			t.Errorf("%s is not a child of %s (trace: %s)", c.child, c.parent, telemetrytest.Names(spans))
		}
	}
	if telemetrytest.Attr(server, payments.AttrOrderID) != "trace-order-1" || telemetrytest.Attr(server, "http.response.status_code") != "201" ||
		telemetrytest.Attr(server, "http.route") != "/api/v1/orders/:order_id/payments" {
		t.Errorf("server span attributes: %v", server.Attributes)
	}
	for _, s := range []string{create.Name, claim.Name, register.Name, call.Name} {
		span := telemetrytest.One(t, spans, s)
		if telemetrytest.Attr(span, payments.AttrSessionID) != id || telemetrytest.Attr(span, payments.AttrOrderID) != "trace-order-1" {
			t.Errorf("%s names session %q order %q, want %s trace-order-1", s, telemetrytest.Attr(span, payments.AttrSessionID),
				telemetrytest.Attr(span, payments.AttrOrderID), id)
		}
	}
	if telemetrytest.Attr(call, gwtrace.AttrGateway) != "refgw" || telemetrytest.Attr(call, gwtrace.AttrOutcome) != "ok" {
		t.Errorf("gateway span attributes: %v", call.Attributes)
	}

	want := "00-" + call.SpanContext.TraceID().String() + "-" + call.SpanContext.SpanID().String() + "-01"
	if got := gw.registrations(); len(got) != 1 || got[0] != want {
		t.Errorf("the gateway received traceparent %q, want %q (the gateway call's span)", got, want)
	}
	if !strings.Contains(logs.String(), `"trace_id":"`+server.SpanContext.TraceID().String()+`"`) {
		t.Errorf("no request log line names the trace:\n%s", logs.String())
	}
	if leaks := telemetrytest.Mentions(rec.Spans(), apiKey, "gw-test-key", "4217", "trace.customer@example.com"); len(leaks) > 0 {
		t.Errorf("spans carry what they must not:\n%s", strings.Join(leaks, "\n"))
	}
}

// TestNoTraceWithoutEndpoint: the server as `serve` builds it with OTEL_EXPORTER_OTLP_ENDPOINT
// unset traces nothing: the gateway gets no traceparent (a span that records nothing has no
// trace to name), not even when the API's caller sent one, and the request log names none.
func TestNoTraceWithoutEndpoint(t *testing.T) {
	t.Parallel()
	pool, gw, cfg, apiKey := tracingBench(t)
	var logs testlog.Buffer
	base, stop := startServeWith(t, cfg, pool, slog.New(slog.NewJSONHandler(&logs, nil)), serveOptions{})
	createPayment(t, base, apiKey, "untraced-1", `{"amount":100,"currency":"EUR"}`, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := gw.registrations(); len(got) != 1 || got[0] != "" {
		t.Errorf("registrations' traceparent headers %q, want one without", got)
	}
	if strings.Contains(logs.String(), "trace_id") || strings.Contains(logs.String(), "tracing:") {
		t.Errorf("tracing is off, yet the log speaks of it:\n%s", logs.String())
	}
}

// TestGatewayAdaptersSendTraceparent: both adapters as cmd builds them (refgw, and Stripe
// through stripe-go's HTTP client) send the trace context of the gateway span they run in.
func TestGatewayAdaptersSendTraceparent(t *testing.T) {
	t.Parallel()
	got := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":{"type":"invalid_request_error","code":"resource_missing","message":"no such payment"}}`)) //nolint:errcheck
	}))
	defer srv.Close()
	rec := telemetrytest.New(t)
	for _, env := range []map[string]string{
		{"GATEWAY_URL": srv.URL, "GATEWAY_API_KEY": "k"},
		{"GATEWAY": "stripe", "GATEWAY_URL": srv.URL, "GATEWAY_API_KEY": "sk_test_123"},
	} {
		cfg, err := config.Load(func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		gw, _, err := buildGateway(cfg, slog.New(slog.DiscardHandler), "serve")
		if err != nil {
			t.Fatal(err)
		}
		ctx, span := rec.Tracer("test").Start(context.Background(), "gateway.status")
		_, _ = gw.Status(ctx, "pi_123")
		span.End()
		sc := span.SpanContext()
		if tp := <-got; tp != "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01" {
			t.Errorf("%s sent traceparent %q, want the span's", gw.Name(), tp)
		}
	}
}
