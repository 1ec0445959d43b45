package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments/gateway/gatewaysim"
)

// TestServeMetricsAddrAndLimits: with METRICS_ADDR, /metrics answers there and not on the public
// port; a request whose headers exceed the bound is refused (431) instead of being read; the
// server has read, write and idle timeouts.
func TestServeMetricsAddrAndLimits(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	metricsAddr := freeAddr(t)
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "METRICS_ADDR": metricsAddr, "SECRET_KEY": strings.Repeat("s", 32),
			"MERCHANT_NAME": "Acme Serve Shop", "GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	base, stop := startRun(t, cfg, pool)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	status := func(req *http.Request) int {
		t.Helper()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp.StatusCode
	}
	get := func(url string) *http.Request {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		return req
	}
	// The server reads the database's clock: this host's offset from it is measured and reported.
	if resp, err := client.Do(get("http://" + metricsAddr + "/metrics")); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "\npitlane_host_clock_offset_seconds ") {
			t.Errorf("/metrics on METRICS_ADDR = %d, want 200 with the host clock's offset:\n%s", resp.StatusCode, body)
		}
	}
	if code := status(get(base + "/metrics")); code != http.StatusNotFound {
		t.Errorf("/metrics on the public port with METRICS_ADDR set = %d, want 404", code)
	}
	// The checkout names the configured merchant, even on its refusal page (no link and no page
	// token: the page of an order that does not exist, 404).
	if resp, err := client.Get(base + "/checkout/o-1"); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "Acme Serve Shop") {
			t.Errorf("checkout without a link = %d, want 404 naming MERCHANT_NAME:\n%s", resp.StatusCode, body)
		}
	}
	big := get(base + "/healthz")
	big.Header.Set("X-Padding", strings.Repeat("x", 2*maxHeaderBytes))
	if code := status(big); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("oversized headers = %d, want 431", code)
	}

	srv := httpServer(http.NotFoundHandler(), cfg, slog.New(slog.DiscardHandler))
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= cfg.GatewayTimeout || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes != maxHeaderBytes {
		t.Errorf("server limits: %+v", srv)
	}
	if err := stop(); err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
	if c, err := net.DialTimeout("tcp", metricsAddr, time.Second); err == nil {
		c.Close()
		t.Error("the metrics listener outlived the server")
	}
}

// freeAddr is a loopback address with a port nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// The patrol waits for this binary's migrations (a replica started before `pitlane migrate`
// answers /readyz 503 and must not drive payments on the old schema meanwhile): waitMigrated
// gives up only with its context on a database without them, and returns at once on one with.
func TestPatrolWaitsForMigrations(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	empty := testdb.Pool(t, testdb.NewEmptyURL(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool, 1)
	go func() { done <- waitMigrated(ctx, empty, logger) }()
	cancel()
	if ok := <-done; ok {
		t.Fatal("waitMigrated on a database without migrations says migrated")
	}
	if !waitMigrated(context.Background(), testdb.New(t), logger) {
		t.Fatal("waitMigrated on a migrated database says not migrated")
	}
}

// serve listening on every interface without PUBLIC_BASE_URL says that its links point at
// localhost; a named host, or PUBLIC_BASE_URL, is quiet.
func TestServeWarnsOfLocalhostLinks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, base string
		warn       bool
	}{
		{":8080", "", true}, {"0.0.0.0:8080", "", true}, {"[::]:8080", "", true},
		{"127.0.0.1:8080", "", false}, {"pay.internal:8080", "", false}, {":8080", "https://pay.example.com", false},
	} {
		var log strings.Builder
		vars := map[string]string{"HTTP_ADDR": tc.addr, "PUBLIC_BASE_URL": tc.base}
		env := &Env{Getenv: func(k string) string { return vars[k] }, Logger: slog.New(slog.NewTextHandler(&log, nil))}
		cfg, err := env.Config()
		if err != nil {
			t.Fatal(err)
		}
		warnLocalLinks(env, cfg)
		if got := strings.Contains(log.String(), "PUBLIC_BASE_URL is unset"); got != tc.warn {
			t.Errorf("HTTP_ADDR=%q PUBLIC_BASE_URL=%q: warned %v, want %v (%s)", tc.addr, tc.base, got, tc.warn, log.String())
		}
	}
}

// serve says at the start which settings suit a laptop and not a service customers pay through:
// a plain-http PUBLIC_BASE_URL others reach, TRUSTED_PROXIES over every address, the gateway
// simulator's key (an outside review: it took them silently). Production-like settings are quiet.
func TestServeWarnsOfDevelopmentSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		vars map[string]string
		warn string
	}{
		{map[string]string{"PUBLIC_BASE_URL": "http://pay.example.com"}, "plain http"},
		{map[string]string{"PUBLIC_BASE_URL": "http://203.0.113.7:8080"}, "plain http"},
		{map[string]string{"TRUSTED_PROXIES": "0.0.0.0/0"}, "trusts every address"},
		{map[string]string{"TRUSTED_PROXIES": "10.0.0.1,::/0"}, "trusts every address"},
		{map[string]string{"GATEWAY_API_KEY": gatewaysim.DefaultAPIKey}, "simulator's key"},
		{map[string]string{"PUBLIC_BASE_URL": "https://pay.example.com", "TRUSTED_PROXIES": "10.0.0.0/8", "GATEWAY_API_KEY": "sk_live_x"}, ""},
		{map[string]string{"PUBLIC_BASE_URL": "http://localhost:8080"}, ""},
		{map[string]string{"PUBLIC_BASE_URL": "http://127.0.0.1:8080"}, ""},
		{map[string]string{}, ""}, // the default is http://127.0.0.1:8080: warnLocalLinks' case
	} {
		var log strings.Builder
		env := &Env{Getenv: func(k string) string { return tc.vars[k] }, Logger: slog.New(slog.NewTextHandler(&log, nil))}
		cfg, err := env.Config()
		if err != nil {
			t.Fatal(err)
		}
		warnDevSettings(env, cfg)
		if got := log.String(); (tc.warn == "") != (got == "") || !strings.Contains(got, tc.warn) {
			t.Errorf("%v: logged %q, want a warning with %q", tc.vars, got, tc.warn)
		}
	}
}
