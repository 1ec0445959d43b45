package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/payments/gateway/gatewaysim"
)

// API Creates over HTTP with 1, 2 and 3 `pitlane serve` processes on one PostgreSQL (issue 14,
// docs/scaling.md): the same binary an operator runs, each process with its own pool (pgx's
// default size), its patrol running, in front of the reference-gateway simulator answering at
// once; clients send POST /api/v1/orders/{id}/payments with an Idempotency-Key, a new order each,
// createClients per replica, spread round-robin over the replicas (the balancer's part).
//
// Anchors: for one replica, the core doing the same Creates in-process against the fake gateway
// with the same concurrency (what HTTP, API keys, idempotency keys, the gateway's HTTP and a
// process of its own add); for N replicas, N times one replica's figure (linear scaling: the
// ratio says how much of it one PostgreSQL gives).
const createClients = 8

func apiCreates(ctx context.Context, env *Env) ([]Figure, error) {
	n := env.Size(60, 3000) // Creates per replica
	bin, err := buildPitlane(ctx, env)
	if err != nil {
		return nil, err
	}
	core, err := createsInProcess(ctx, env, n)
	if err != nil {
		return nil, fmt.Errorf("in process: %w", err)
	}
	env.Logf("  API creates in process (anchor): %.0f/s", core)
	var out []Figure
	var one float64
	for replicas := 1; replicas <= 3; replicas++ {
		rate, err := createsOverHTTP(ctx, env, bin, replicas, n*replicas)
		if err != nil {
			return nil, fmt.Errorf("%d replicas: %w", replicas, err)
		}
		env.Logf("  API creates x%d: %.0f/s", replicas, rate)
		f := Figure{Name: fmt.Sprintf("API creates over HTTP x%d", replicas), Value: rate, Unit: "creates/s", ReportOnly: true}
		if replicas == 1 {
			one = rate
			f.Anchor, f.AnchorValue = fmt.Sprintf("the core in process, %d at once", createClients), core
		} else {
			f.Anchor, f.AnchorValue = fmt.Sprintf("%d x one replica", replicas), float64(replicas)*one
		}
		out = append(out, f)
	}
	return out, nil
}

// buildPitlane builds cmd/pitlane into a temporary directory with the go tool running this
// program (with -race when this program has it: the test's build cache then serves it).
func buildPitlane(ctx context.Context, env *Env) (string, error) {
	dir, err := os.MkdirTemp("", "pitlane-bench-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "pitlane")
	args := []string{"build", "-o", bin}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	started := time.Now()
	out, err := exec.CommandContext(ctx, "go", append(args, "pitlane/cmd/pitlane")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/pitlane: %w\n%s", err, out)
	}
	env.Logf("  built %s in %s", bin, time.Since(started).Round(time.Second))
	return bin, nil
}

// createsInProcess is the anchor: n Creates by createClients goroutines through payments.Create
// against the fake gateway, on a fresh database.
func createsInProcess(ctx context.Context, env *Env, n int) (float64, error) {
	url, err := env.NewDatabase(ctx, true)
	if err != nil {
		return 0, err
	}
	pool, err := Pool(ctx, url, createClients+4)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	svc := payments.NewService(pool, payments.Config{Gateway: fakegw.New(), ReplicaID: "bench-core", Logger: slog.New(slog.DiscardHandler)})
	actor := payments.Actor{Kind: payments.ActorAPI, ID: "bench"}
	return drive(createClients, n, func(i int) error {
		_, err := svc.Create(ctx, actor, payments.CreateInput{OrderID: fmt.Sprintf("core-%d", i), Amount: 1500, Currency: "EUR"})
		return err
	})
}

// createsOverHTTP starts replicas `pitlane serve` processes on a fresh database and sends them
// n Creates from createClients clients per replica.
func createsOverHTTP(ctx context.Context, env *Env, bin string, replicas, n int) (float64, error) {
	url, err := env.NewDatabase(ctx, true)
	if err != nil {
		return 0, err
	}
	pool, err := Pool(ctx, url, 2)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	_, apiKey, err := access.New(pool, nil).CreateAPIClient(ctx, payments.Staff{Email: "bench"}, "bench")
	if err != nil {
		return 0, err
	}
	sim := gatewaysim.New(gatewaysim.Options{APIKey: "bench-gw-key"})
	simSrv := httptest.NewServer(sim)
	defer func() {
		simSrv.Close()
		sim.Close() //nolint:errcheck
	}()

	bases := make([]string, replicas)
	for r := range replicas {
		base, stop, err := startServe(ctx, bin, map[string]string{
			"DATABASE_URL": url, "GATEWAY_URL": simSrv.URL, "GATEWAY_API_KEY": "bench-gw-key",
			"SECRET_KEY": strings.Repeat("b", 32), "REPLICA_ID": fmt.Sprintf("bench-%d", r), "MERCHANT_NAME": "bench",
		})
		if err != nil {
			return 0, err
		}
		defer stop()
		bases[r] = base
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: createClients * replicas}, Timeout: time.Minute}
	defer client.CloseIdleConnections()
	return drive(createClients*replicas, n, func(i int) error {
		order := fmt.Sprintf("http-%d", i)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, bases[i%replicas]+"/api/v1/orders/"+order+"/payments",
			strings.NewReader(`{"amount":1500,"currency":"EUR"}`))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", order)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("create %s: %d %s", order, resp.StatusCode, body)
		}
		return nil
	})
}

// drive runs n calls of do (numbered 0…n-1) from workers goroutines and returns calls per second.
func drive(workers, n int, do func(i int) error) (float64, error) {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	started := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := do(i); err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(n)) // stop the others
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(n) / time.Since(started).Seconds(), nil
}

// startServe runs `pitlane serve` with env on a free port until /readyz answers 200; stop sends
// SIGTERM and waits for it (SIGKILL after 30 s).
func startServe(ctx context.Context, bin string, env map[string]string) (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "HTTP_ADDR="+addr)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var logs bytes.Buffer // the request log is long: only the tail is shown on failure
	cmd.Stderr = &tailWriter{buf: &logs, max: 8 << 10}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	base = "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base, stop, nil
			}
		}
		select {
		case err := <-exited:
			return "", nil, fmt.Errorf("pitlane serve exited: %v\n%s", err, logs.String())
		case <-ctx.Done():
			stop()
			return "", nil, ctx.Err()
		case <-time.After(50 * time.Millisecond): // a program that reports, not a test: polling is fine
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("pitlane serve never became ready:\n" + logs.String())
		}
	}
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	buf *bytes.Buffer
	max int
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if over := w.buf.Len() - w.max; over > 0 {
		w.buf.Next(over)
	}
	return len(p), nil
}
