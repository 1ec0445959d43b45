package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
)

// TestServeShutdownUnderLoad: SIGTERM to a real `pitlane serve` process while requests and
// sweeper drives are parked in a slow gateway (the reference-gateway simulator's pause):
//
//   - it stops accepting (a new connection is refused) while the requests in flight go on;
//   - it finishes every request in flight: each Create parked at the gateway answers 201 once
//     the gateway answers — no request is cut;
//   - it gives its sweeper leases back: the drives cut at their gateway call leave no lease, and
//     their sessions are due now with their schedule untouched;
//   - it closes its pool (no backend of its application_name is left; its last log line says so)
//     and exits 0;
//   - a second replica's next round drives every released session at once, with no clock moved:
//     not after the lease (six gateway timeouts) would have run out. Without the patrol's
//     shutdown release (payments.releaseBatch, interrupted) the sessions are due only after the
//     next step of their schedule, and replica-b's round drives none of them.
func TestServeShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		inFlight = 4 // API Creates parked at the gateway when SIGTERM comes
		drives   = 3 // sweeper drives parked at the gateway when SIGTERM comes
	)
	dbURL := testdb.NewURL(t)
	pool := testdb.Pool(t, dbURL)
	ctx := context.Background()
	sim := gatewaysim.New(gatewaysim.Options{APIKey: "gw-test-key"})
	simSrv := httptest.NewServer(sim)
	t.Cleanup(func() {
		simSrv.Close()
		sim.Close() //nolint:errcheck
	})
	_, apiKey, err := access.New(pool, nil).CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "shop")
	if err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	const appName = "pitlane-shutdown-a"
	cmd := pitlane(map[string]string{
		"DATABASE_URL": dbURL + "&application_name=" + appName, "HTTP_ADDR": addr, "GATEWAY_URL": simSrv.URL,
		"GATEWAY_API_KEY": "gw-test-key", "GATEWAY_TIMEOUT": "30s", "SECRET_KEY": strings.Repeat("s", 32),
		"REPLICA_ID": "replica-a", "SWEEP_INTERVAL": "100ms", "MERCHANT_NAME": "Shutdown Shop",
	}, "serve")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	logs := newLogLines(stderr)
	logs.await(t, "msg=serving")
	base := "http://" + addr

	client := &http.Client{Timeout: 2 * time.Minute}
	defer client.CloseIdleConnections()
	create := func(order string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/orders/"+order+"/payments", strings.NewReader(`{"amount":1500,"currency":"EUR"}`))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "shutdown-"+order)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var p struct {
			ID string `json:"id"`
		}
		err = json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p.ID, err
	}

	// Sessions the sweeper will be driving: registered now, then made due while the gateway's
	// status answers are paused, so each drive parks at its gateway call.
	var driven []string
	for i := range drives {
		code, id, err := create(fmt.Sprintf("swept-%d", i))
		if err != nil || code != http.StatusCreated {
			t.Fatalf("create: %d %v", code, err)
		}
		driven = append(driven, id)
	}
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := sim.Pause(gatewaysim.OpStatus); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE payment_sessions SET next_check_at = now() WHERE id = ANY($1)`, driven); err != nil {
		t.Fatal(err)
	}
	if err := sim.WaitParked(wait, gatewaysim.OpStatus, drives); err != nil {
		t.Fatalf("the sweeper's drives never reached the gateway: %v", err)
	}

	// Requests in flight: Creates parked in the gateway's registration.
	if err := sim.Pause(gatewaysim.OpRegister); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		id   string
		err  error
	}
	answers := make(chan answer, inFlight)
	for i := range inFlight {
		go func() {
			code, id, err := create(fmt.Sprintf("in-flight-%d", i))
			answers <- answer{code, id, err}
		}()
	}
	if err := sim.WaitParked(wait, gatewaysim.OpRegister, inFlight); err != nil {
		t.Fatalf("the requests never reached the gateway: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	logs.await(t, "msg=\"shutting down\"")
	// It stops accepting: the listener closes at once (a refused dial), while the requests
	// above are still parked at the gateway.
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the server still accepts connections after SIGTERM")
		}
	}
	if n := sim.Parked(gatewaysim.OpRegister); n != inFlight {
		t.Fatalf("%d requests parked at the gateway after the listener closed, want %d", n, inFlight)
	}

	// The gateway answers: every request in flight finishes with its payment.
	sim.Release(gatewaysim.OpRegister)
	for range inFlight {
		a := <-answers
		if a.err != nil || a.code != http.StatusCreated || a.id == "" {
			t.Errorf("a request in flight at SIGTERM: %d %q %v (want 201: no request is cut)", a.code, a.id, a.err)
		}
	}
	// Every line read before Wait closes the pipe (os/exec: Wait must follow the reads): the
	// last line was now and then still in the pipe, and the check below read the one before it.
	select {
	case <-logs.eof:
	case <-time.After(time.Minute):
		t.Fatalf("serve has not exited a minute after SIGTERM:\n%s", logs.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v (want exit 0)\n%s", err, logs.String())
	}
	if !strings.Contains(logs.last(), "stopped: database pool closed") {
		t.Errorf("last log line %q, want the pool closed", logs.last())
	}

	// Its leases are given back, its sessions due now with their schedule untouched, its
	// connections gone.
	if n := countRows(t, pool, `SELECT count(*) FROM payment_sessions WHERE lease_token IS NOT NULL OR lease_owner IS NOT NULL`); n != 0 {
		t.Errorf("%d sessions still leased after the replica stopped", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM payment_sessions WHERE id = ANY($1) AND next_check_at <= now() AND check_attempts = 0`, driven); n != drives {
		t.Errorf("%d of %d cut sessions given back due now with their schedule untouched", n, drives)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM sweeper_heartbeats WHERE replica_id = 'replica-a'`); n != 0 {
		t.Errorf("replica-a's heartbeat row outlived it")
	}
	waitFor(t, "replica-a's connections to end", func() bool {
		return countRows(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName) == 0
	})

	// A second replica's next round drives every released session at once.
	sim.Release(gatewaysim.OpStatus)
	cfgB, err := config.Load(func(k string) string {
		return map[string]string{"GATEWAY_URL": simSrv.URL, "GATEWAY_API_KEY": "gw-test-key", "REPLICA_ID": "replica-b"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	gw, _, err := buildGateway(cfgB, slog.New(slog.DiscardHandler), "serve")
	if err != nil {
		t.Fatal(err)
	}
	b := payments.NewService(pool, payments.Config{Gateway: gw, ReplicaID: "replica-b", GatewayTimeout: cfgB.GatewayTimeout,
		CodeSecret: []byte(strings.Repeat("s", 32)), Logger: slog.New(slog.DiscardHandler)})
	if n, err := b.SweepOnce(ctx); err != nil || n < drives {
		t.Fatalf("replica-b's round drove %d (%v), want at least the %d released sessions", n, err, drives)
	}
	if n := countRows(t, pool, `SELECT count(DISTINCT session_id) FROM gateway_calls
		WHERE replica_id = 'replica-b' AND operation = 'status' AND session_id = ANY($1)`, driven); n != drives {
		t.Errorf("replica-b asked the gateway about %d of the %d released sessions in its first round", n, drives)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// logLines collects a process's log lines as they come; await blocks until one contains a
// string (the process announcing a step), or fails after 30 s.
type logLines struct {
	mu    sync.Mutex
	lines []string
	more  chan struct{}
	eof   chan struct{} // closed once the process's stderr is read to its end
}

func newLogLines(r io.Reader) *logLines {
	l := &logLines{more: make(chan struct{}, 1), eof: make(chan struct{})}
	go func() {
		defer close(l.eof)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l.mu.Lock()
			l.lines = append(l.lines, sc.Text())
			l.mu.Unlock()
			select {
			case l.more <- struct{}{}:
			default:
			}
		}
	}()
	return l
}

func (l *logLines) await(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for seen := 0; ; {
		l.mu.Lock()
		lines := l.lines[seen:]
		seen = len(l.lines)
		l.mu.Unlock()
		for _, line := range lines {
			if strings.Contains(line, s) {
				return
			}
		}
		select {
		case <-l.more:
		case <-timeout:
			t.Fatalf("no log line with %q:\n%s", s, l.String())
		}
	}
}

func (l *logLines) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 0 {
		return ""
	}
	return l.lines[len(l.lines)-1]
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
