package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
)

// A request still running when the stop's grace (max(15 s, GATEWAY_TIMEOUT + 5 s)) runs out was
// cut by srv.Close: its client got a dropped connection (EOF), not the contract's problem+json
// 503 with Retry-After that a request cut at its own bound gets — and a request may run
// RequestTimeoutFor (3 × GATEWAY_TIMEOUT + 25 s), far past the grace. Here a Check of a payment
// whose registration answer was lost asks a slow gateway twice (find by reference, then the
// payment by id), each within GATEWAY_TIMEOUT. Now the grace's end cuts the requests through
// the server's base context (web.ErrStopping) and each answers 503 before the server closes.
// An outside review (restart); negative control: without the base context's cut, EOF.
func TestStopAnswersTheRequestItCuts(t *testing.T) {
	t.Parallel()
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
	// Another replica leads the reconciliation for the day: its walk would ask the gateway for
	// this payment's reference beside the Check, and the test must know the look-up it waits
	// for is the Check's.
	if _, err := pool.Exec(ctx, `INSERT INTO maintenance_leaders (job, owner, elected_at, until)
		VALUES ('reconcile:refgw', 'replica-elsewhere', now(), now() + interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := pitlane(map[string]string{
		"DATABASE_URL": dbURL, "HTTP_ADDR": addr, "GATEWAY_URL": simSrv.URL,
		"GATEWAY_API_KEY": "gw-test-key", "GATEWAY_TIMEOUT": "10s", "SECRET_KEY": strings.Repeat("s", 32),
		"REPLICA_ID": "replica-cut", "MERCHANT_NAME": "Cut Shop",
		// The patrol's first round runs at the start, before the payment exists; the next
		// would find it due 5 s after its Create (Backoff[0]) and look it up itself, before
		// the UPDATE below on a stalled test, answering the Check's question first.
		"SWEEP_INTERVAL": "1h",
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

	// A payment whose registration the gateway made but whose answer was lost: Unknown, no
	// gateway id. The patrol is kept off it (it would ask beside the Check).
	sim.DropNext(gatewaysim.OpRegister, 1)
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/orders/cut-1/payments", strings.NewReader(`{"amount":1500,"currency":"EUR"}`))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&p)
	resp.Body.Close()
	if p.ID == "" || p.Status != "Unknown" {
		t.Fatalf("create: %d %+v, want an Unknown payment", resp.StatusCode, p)
	}
	if _, err := pool.Exec(ctx, `UPDATE payment_sessions SET next_check_at = now() + interval '1 hour' WHERE id = $1`, p.ID); err != nil {
		t.Fatal(err)
	}

	// A slow gateway: each call answered in 9 s, inside GATEWAY_TIMEOUT (10 s).
	for _, op := range []gatewaysim.Op{gatewaysim.OpFind, gatewaysim.OpStatus} {
		if err := sim.SetFaults(op, gatewaysim.Faults{Latency: 9 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	type answer struct {
		code  int
		ctype string
		retry string
		body  string
		err   error
	}
	answers := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/payments/"+p.ID+"/check", nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := client.Do(req)
		if err != nil {
			answers <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		answers <- answer{resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Retry-After"), string(b), err}
	}()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The Check's own look-up of the payment's reference: counting every find call, a CI run
	// took another's (the patrol's health probe or the reconciliation's walk) for it and sent
	// the SIGTERM before the Check had reached the server (a reset connection, not a 503).
	if err := sim.WaitLookups(wait, p.ID, 1); err != nil {
		t.Fatal(err)
	}
	// SIGTERM while the Check waits for its first answer.
	started := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	logs.await(t, `msg="shutting down"`)
	a := <-answers
	t.Logf("answer %s after SIGTERM", time.Since(started).Round(time.Millisecond))
	if a.err != nil || a.code != http.StatusServiceUnavailable || !strings.HasPrefix(a.ctype, "application/problem+json") || a.retry == "" {
		t.Errorf("the Check cut by the shutdown: %d %q Retry-After %q %q err %v; want 503 problem+json with Retry-After",
			a.code, a.ctype, a.retry, a.body, a.err)
	}
	select {
	case <-logs.eof:
	case <-time.After(time.Minute):
		t.Fatalf("serve has not exited a minute after SIGTERM:\n%s", logs.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve exited with %v after the stop, want 0:\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "shutdown grace ran out: cutting the requests still in flight") {
		t.Errorf("the stop did not say it cut requests:\n%s", logs.String())
	}
}
