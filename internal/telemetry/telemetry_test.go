package telemetry_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"pitlane/internal/config"
	"pitlane/internal/telemetry"
)

// collector is an OTLP/HTTP receiver of traces: it keeps every export request it is sent.
type collector struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []*coltracepb.ExportTraceServiceRequest
	raw int // requests of any kind, decodable or not
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.raw++
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "not an OTLP/HTTP traces export", http.StatusBadRequest)
			return
		}
		c.got = append(c.got, &req)
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Write(out) //nolint:errcheck
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *collector) requests() (decoded []*coltracepb.ExportTraceServiceRequest, all int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*coltracepb.ExportTraceServiceRequest(nil), c.got...), c.raw
}

func load(t *testing.T, env map[string]string) config.Config {
	t.Helper()
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestTracingExportsOverOTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set, spans reach the collector
// at <endpoint>/v1/traces as OTLP/HTTP protobuf, the resource naming pitlane and the replica.
func TestTracingExportsOverOTLP(t *testing.T) {
	t.Parallel()
	col := newCollector(t)
	cfg := load(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": col.srv.URL, "REPLICA_ID": "replica-7"})
	tr, err := telemetry.Start(context.Background(), cfg.OTLPTracesEndpoint, cfg.ReplicaID, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Exporting() {
		t.Fatal("an endpoint is set, yet nothing is exported")
	}
	_, span := tr.Provider.Tracer("test").Start(context.Background(), "payments.check")
	span.End()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	reqs, _ := col.requests()
	var names []string
	resource := map[string]string{}
	for _, r := range reqs {
		for _, rs := range r.ResourceSpans {
			for _, kv := range rs.Resource.Attributes {
				resource[kv.Key] = kv.Value.GetStringValue()
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names = append(names, s.Name)
				}
			}
		}
	}
	if len(names) != 1 || names[0] != "payments.check" {
		t.Errorf("the collector received spans %v, want [payments.check]", names)
	}
	if resource["service.name"] != "pitlane" || resource["service.instance.id"] != "replica-7" {
		t.Errorf("resource %v", resource)
	}
}

// TestTracingOffSendsNothing: without an endpoint the provider is a no-op: its spans record
// nothing and have no trace id (so no traceparent goes anywhere either), and there is no
// exporter. Proved against a collector that an exporter built by mistake from the SDK's own
// reading of the environment would reach (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set in the
// process for this test, as an operator might leave it while OTEL_SDK_DISABLED says off).
func TestTracingOffSendsNothing(t *testing.T) {
	col := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", col.srv.URL+"/v1/traces")
	for _, env := range []map[string]string{
		{},
		{"OTEL_SERVICE_NAME": "pitlane-eu", "OTEL_TRACES_SAMPLER": "always_on"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": col.srv.URL, "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": col.srv.URL, "OTEL_TRACES_EXPORTER": "none"},
	} {
		cfg := load(t, env)
		if cfg.OTLPTracesEndpoint != "" {
			t.Fatalf("%v: endpoint %q, want none", env, cfg.OTLPTracesEndpoint)
		}
		tr, err := telemetry.Start(context.Background(), cfg.OTLPTracesEndpoint, "r", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		_, span := tr.Provider.Tracer("test").Start(context.Background(), "payments.create")
		if span.IsRecording() || span.SpanContext().IsValid() || tr.Exporting() {
			t.Errorf("%v: span recording %v valid %v, exporting %v", env, span.IsRecording(), span.SpanContext().IsValid(), tr.Exporting())
		}
		span.End()
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, n := col.requests(); n != 0 {
		t.Errorf("the collector received %d requests with tracing off", n)
	}
}

// TestTracingSettings: the traces URL from the base endpoint or the traces one, and the settings
// pitlane cannot honour refused with the variable's name (exit 2) instead of sent wrong.
func TestTracingSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env     map[string]string
		want    string
		wantErr string
	}{
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, want: "http://collector:4318/v1/traces"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://traces.example/otlp"}, want: "https://traces.example/otlp"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, want: "http://collector:4318/v1/traces"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, wantErr: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, wantErr: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}, wantErr: "OTEL_TRACES_EXPORTER"},
	} {
		cfg, err := config.Load(func(k string) string { return tc.env[k] })
		if tc.wantErr != "" {
			var cerr *config.Error
			if !errors.As(err, &cerr) || cerr.Var != tc.wantErr {
				t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.wantErr)
			}
			continue
		}
		if err != nil || cfg.OTLPTracesEndpoint != tc.want {
			t.Errorf("%v: endpoint %q (%v), want %q", tc.env, cfg.OTLPTracesEndpoint, err, tc.want)
		}
	}
}
