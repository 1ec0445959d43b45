package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
)

// The figures over HTTP drive a real `pitlane serve` process — the binary built from this tree,
// configured from its environment like any replica — against the reference-gateway simulator
// (gatewaysim, served from this program) with a closed-loop client (load.go).
//
//   - API Create: 64 clients creating payments for distinct orders while the gateway takes 50 ms
//     to register, beside the ideal min(64 / 50 ms, the core's own Create rate, the "create"
//     figure's load measured right before and right after the HTTP window): the API may lose at
//     most 30 % to HTTP, authentication, the intent key and the gateway adapter.
//   - Resident memory: VmRSS of the serve process (/proc/PID/status) before and after 200,000
//     distinct orders (the seed's semaphore dictionary grew by one entry per order; pitlane must
//     keep no per-order state): growth under 30 MB.

const (
	apiClients = 64
	apiLatency = 50 * time.Millisecond
)

// server is one running `pitlane serve` with its gateway simulator and an API key.
type server struct {
	url  string
	key  string
	sim  *gatewaysim.Sim
	cmd  *exec.Cmd
	logs string
	http *http.Client
	stop func()
}

// pitlaneBinary builds cmd/pitlane once per run.
func pitlaneBinary(ctx context.Context, env *Env) (string, error) {
	if env.binary != "" {
		return env.binary, nil
	}
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	dir, err := os.MkdirTemp("", "pitlane-bench-bin-")
	if err != nil {
		return "", err
	}
	env.cleanup = append(env.cleanup, func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "pitlane")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/pitlane")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/pitlane: %w\n%s", err, out)
	}
	env.binary = bin
	return bin, nil
}

// startServer starts `pitlane serve` on a fresh database with a simulator whose registrations
// take registerLatency, and creates an API key for the load.
func startServer(ctx context.Context, env *Env, registerLatency time.Duration, clients int) (*server, error) {
	bin, err := pitlaneBinary(ctx, env)
	if err != nil {
		return nil, err
	}
	dbURL, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	setup, err := Pool(ctx, dbURL, 2)
	if err != nil {
		return nil, err
	}
	_, key, err := access.New(setup, nil).CreateAPIClient(ctx, payments.Staff{Email: "bench"}, "bench")
	setup.Close()
	if err != nil {
		return nil, err
	}
	const gwKey = "bench-gateway-key"
	sim := gatewaysim.New(gatewaysim.Options{APIKey: gwKey})
	if err := sim.SetFaults(gatewaysim.OpRegister, gatewaysim.Faults{Latency: registerLatency}); err != nil {
		return nil, err
	}
	gwSrv := httptest.NewServer(sim)
	port, err := freePort()
	if err != nil {
		gwSrv.Close()
		return nil, err
	}
	logs, err := os.CreateTemp("", "pitlane-bench-serve-*.log")
	if err != nil {
		gwSrv.Close()
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "HTTP_ADDR="+addr, "SECRET_KEY="+strings.Repeat("b", 40),
		"GATEWAY=refgw", "GATEWAY_URL="+gwSrv.URL, "GATEWAY_API_KEY="+gwKey, "REPLICA_ID=bench-serve")
	if dir := env.Getenv("BENCH_PROFILE"); dir != "" {
		// The replica's own Go CPU profile, one file per server the run starts.
		env.servers++
		cmd.Env = append(cmd.Env, "PITLANE_CPU_PROFILE="+filepath.Join(dir, fmt.Sprintf("serve-%d.pprof", env.servers)))
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		logs.Close()
		gwSrv.Close()
		return nil, err
	}
	s := &server{url: "http://" + addr, key: key, sim: sim, cmd: cmd, logs: logs.Name(),
		http: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConns: clients + 8, MaxIdleConnsPerHost: clients + 8}}}
	s.stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logs.Close()
		os.Remove(logs.Name())
		gwSrv.Close()
		sim.Close()
	}
	// Polling for readiness: a benchmark's start-up, not a test's event.
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := s.http.Get(s.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			out, _ := os.ReadFile(logs.Name())
			s.stop()
			return nil, fmt.Errorf("pitlane serve did not become ready: %v\n%s", err, tail(string(out), 2000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// create is one POST /api/v1/orders/{order}/payments without an Idempotency-Key; it must answer
// 201 (a new session the gateway registered).
func (s *server) create(ctx context.Context, order string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/api/v1/orders/"+order+"/payments",
		strings.NewReader(`{"amount":1000,"currency":"EUR"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("create %s: %d %s", order, resp.StatusCode, bytes.TrimSpace(body))
	}
	return nil
}

// rssMB is the serve process's resident set (VmRSS) in MB.
func (s *server) rssMB() (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "123456 kB"
			kb, err := strconv.ParseFloat(f[0], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", s.cmd.Process.Pid)
}

// apiCreate: the API over HTTP against its ideal, min(64 / 50 ms, the core's Create rate). The
// core's rate is measured again around the HTTP window, on a database of its own with the same
// clients as the create figure: one round right before the server starts, one right after it
// stopped, and the ideal takes their mean. The create figure ran minutes earlier, and this
// machine drifts by ±20% in minutes: an anchor from another time measures the drift as much as
// the API. The round after waits for the server to stop, so the patrol's looks at the sessions
// the API made (due 5 s after each Create) land in the HTTP window, where a replica does them,
// and not in the core's round.
func apiCreate(ctx context.Context, env *Env) ([]Figure, error) {
	core, err := newCoreCreates(ctx, env)
	if err != nil {
		return nil, err
	}
	defer core.close()
	round := time.Duration(env.Size(2, 5)) * time.Second
	before, cpuBefore, err := core.round(ctx, round)
	if err != nil {
		return nil, err
	}
	srv, err := startServer(ctx, env, apiLatency, apiClients)
	if err != nil {
		return nil, err
	}
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(srv.stop) }
	defer stop()
	create := func(ctx context.Context, w, seq int) error { return srv.create(ctx, fmt.Sprintf("api-%d-%d", w, seq)) }
	if _, err := closedLoop(ctx, apiClients, 0, apiClients*4, func(ctx context.Context, w, seq int) error { return create(ctx, w, -seq-1) }); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	cpu0 := sampleCPU(srv.cmd.Process.Pid)
	res, err := closedLoop(ctx, apiClients, time.Duration(env.Size(3, 15))*time.Second, 0, create)
	if err != nil {
		return nil, err
	}
	cpu1 := sampleCPU(srv.cmd.Process.Pid)
	env.Logf("  api: CPU per Create (ms): %s", perOp(cpu0, cpu1, res.n))
	_, apiCPU := cpuPerOp(cpu0, cpu1, res.n)
	stop()
	after, cpuAfter, err := core.round(ctx, round)
	if err != nil {
		return nil, err
	}
	coreCPU := (cpuBefore + cpuAfter) / float64(max(before.n+after.n, 1))
	if apiCPU > 0 {
		env.Logf("  api: CPU per Create through the core around it %.2f ms, over HTTP %.2f ms: where both keep the cores busy, HTTP reaches at most %.2f of the ideal",
			coreCPU, apiCPU, coreCPU/apiCPU)
	}
	coreRate := (before.rate() + after.rate()) / 2
	ideal := min(float64(apiClients)/apiLatency.Seconds(), coreRate)
	env.Logf("  api: %.0f creates/s over HTTP (p50 %.1f ms); the core around it %.0f/s before, %.0f/s after; ideal %.0f",
		res.rate(), ms(percentile(res.lat, 50)), before.rate(), after.rate(), ideal)
	// Beside the rate, what it is made of: the CPU one Create costs over HTTP (every process on
	// the machine: the replica, PostgreSQL, this program's load generator and gateway simulator)
	// against what it costs through the core in the rounds around it. On cores both runs keep
	// busy, the rate over HTTP cannot pass the ideal divided by this ratio (docs/performance.md).
	return []Figure{{Name: fmt.Sprintf("API Create over HTTP, distinct orders, gateway 50ms, %d clients", apiClients), Value: res.rate(),
		Unit: "creates/s", Anchor: fmt.Sprintf("ideal: min(%d / 50ms, core Create rate, C=%d, right before and after)", apiClients, benchClients),
		AnchorValue: ideal, MinRatio: 0.7},
		{Name: "API Create over HTTP: CPU per Create, all processes (replica, PostgreSQL, load generator and gateway simulator)",
			Value: apiCPU, Unit: "ms", Anchor: "CPU per Create through the core, the rounds around it (its Go and load, PostgreSQL)",
			AnchorValue: coreCPU, ReportOnly: true}}, nil
}

func residentMemory(ctx context.Context, env *Env) ([]Figure, error) {
	const clients = 32
	n := env.Size(1000, 200000)
	if v := env.Getenv("BENCH_MEMORY_ORDERS"); v != "" { // a machine too busy for 200,000 in reasonable time
		if m, err := strconv.Atoi(v); err == nil && m > 0 {
			n = m
		}
	}
	srv, err := startServer(ctx, env, 0, clients)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	// The first requests fill what every process fills once (pools, caches of prepared
	// statements, the HTTP server's buffers): "before" is a warm replica.
	if _, err := closedLoop(ctx, clients, 0, env.Size(200, 2000), func(ctx context.Context, _, seq int) error {
		return srv.create(ctx, fmt.Sprintf("warm-%d", seq))
	}); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	before, err := srv.rssMB()
	if err != nil {
		return nil, err
	}
	res, err := closedLoop(ctx, clients, 0, n, func(ctx context.Context, _, seq int) error {
		return srv.create(ctx, fmt.Sprintf("mem-%d", seq))
	})
	if err != nil {
		return nil, err
	}
	after, err := srv.rssMB()
	if err != nil {
		return nil, err
	}
	env.Logf("  memory: VmRSS %.1f MB before, %.1f MB after %d orders (%.0f creates/s)", before, after, res.n, res.rate())
	return []Figure{{Name: fmt.Sprintf("resident memory of one replica after %d distinct orders over HTTP", n), Value: after, Unit: "MB",
		Anchor: "VmRSS before (flat)", AnchorValue: before, MaxOverAnchor: bound(30)}}, nil
}
