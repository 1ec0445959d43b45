package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/gatewaysim"
	"pitlane/payments/gateway/refgw"
)

// reconcileBench is a database and the gateway simulator over HTTP, with a core service of
// "replica-b" (its own refgw client) for setting up sessions and playing the patrol.
type reconcileBench struct {
	url  string
	pool *pgxpool.Pool
	sim  *gatewaysim.Sim
	gw   *refgw.Client
	svc  *payments.Service
	env  map[string]string
}

func newReconcileBench(t *testing.T) *reconcileBench {
	t.Helper()
	b := &reconcileBench{url: testdb.NewURL(t)}
	b.pool = testdb.Pool(t, b.url)
	b.sim = gatewaysim.New(gatewaysim.Options{APIKey: "sim-key"})
	srv := httptest.NewServer(b.sim)
	t.Cleanup(func() { b.sim.Close(); srv.Close() })
	gw, err := refgw.New(refgw.Options{BaseURL: srv.URL, APIKey: "sim-key"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.CloseIdleConnections)
	b.gw = gw
	b.svc = payments.NewService(b.pool, payments.Config{Gateway: gw, ReplicaID: "replica-b", CodeSecret: []byte("test-secret"),
		Logger: slog.New(slog.DiscardHandler), GatewayURL: srv.URL})
	b.env = map[string]string{"DATABASE_URL": b.url, "GATEWAY_URL": srv.URL, "GATEWAY_API_KEY": "sim-key", "REPLICA_ID": "ops-host"}
	return b
}

func (b *reconcileBench) create(t *testing.T, order string) payments.Session {
	t.Helper()
	r, err := b.svc.Create(context.Background(), payments.Actor{Kind: payments.ActorAPI, ID: "t"},
		payments.CreateInput{OrderID: order, Amount: 1999, Currency: "EUR", CustomerContact: "c@example.com"})
	if err != nil || r.Session.Status != payments.StatusRegistered {
		t.Fatalf("create %s: %+v %v", order, r.Session, err)
	}
	return r.Session
}

// run runs `pitlane reconcile args…` in-process through Main with the bench's settings.
func (b *reconcileBench) run(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string { return env[k] }, Logger: slog.New(slog.DiscardHandler)}
	code = Main(append([]string{"reconcile"}, args...), e)
	return code, out.String(), errOut.String()
}

// TestReconcileCommand: `pitlane reconcile --since 24h` against the simulator finds a late
// payment made by a second gateway payment of a Failed session (one case, its late_payment,
// printed with its id: the money is that case's alone, and the declined own payment took nothing)
// and an approved payment whose webhook never came (driven to Completed), leaves a session
// outside the window alone, exits 0 and gives the lease back; a second run opens nothing new.
func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	b := newReconcileBench(t)
	ctx := context.Background()

	old := b.create(t, "rc-old")
	if _, err := b.sim.Approve(old.GatewayPaymentID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET updated_at = now() - interval '48 hours' WHERE id = $1`, old.ID); err != nil {
		t.Fatal(err)
	}
	paid := b.create(t, "rc-paid")
	if _, err := b.sim.Approve(paid.GatewayPaymentID); err != nil { // captured at once; no webhook is configured
		t.Fatal(err)
	}
	dead := b.create(t, "rc-dead")
	if _, err := b.sim.Decline(dead.GatewayPaymentID, ""); err != nil {
		t.Fatal(err)
	}
	if s, err := b.svc.Check(ctx, payments.Actor{Kind: payments.ActorAPI, ID: "t"}, dead.ID); err != nil || s.Status != payments.StatusFailed {
		t.Fatalf("setup: %s %v", s.Status, err)
	}
	// The customer paid on a second page: a gateway that ignored our key made a second payment.
	b.sim.SetIgnoreIdempotencyKeys(true)
	second, err := b.gw.Register(ctx, payments.RegisterRequest{IdempotencyKey: dead.ID, Reference: dead.Reference(), Amount: dead.Amount, Currency: dead.Currency})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.sim.Approve(second.ID); err != nil {
		t.Fatal(err)
	}
	findsBefore := b.sim.CallCount(gatewaysim.OpFind)

	code, out, stderr := b.run(t, b.env, "--since", "24h")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr: %s", code, out, stderr)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^reconcile refgw: sessions updated since \S+ \(the last 24h0m0s\)$`),
		regexp.MustCompile(`(?m)^found +late_payment +session ` + dead.ID + `  order rc-dead  reconciliation: .*` + second.ID),
		regexp.MustCompile(`(?m)^found +driven +session ` + paid.ID + `  order rc-paid  Registered → Completed`),
		regexp.MustCompile(`(?m)^checked 2 sessions: 1 late payment, 0 duplicate gateway payments, 0 mismatches, 1 driven, 0 errors; 1 cases opened$`),
		regexp.MustCompile(`(?m)^read back 0 refunds settled within 30 days: 0 contradicted by the gateway$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("stdout lacks %s:\n%s", want, out)
		}
	}
	// Every case opened is printed with its id, and every printed case exists.
	rows, err := b.pool.Query(ctx, `SELECT id::text, kind FROM finance_cases WHERE session_id = $1 ORDER BY id`, dead.ID)
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	for rows.Next() {
		var id, kind string
		if err := rows.Scan(&id, &kind); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, "opened  case "+id+"  "+kind+"  session "+dead.ID+"  order rc-dead")
	}
	rows.Close()
	if len(cases) != 1 || strings.Count(out, "opened  case ") != 1 {
		t.Fatalf("cases in the database %q; stdout:\n%s", cases, out)
	}
	for _, c := range cases {
		if !strings.Contains(out, c+"\n") {
			t.Errorf("stdout lacks %q:\n%s", c, out)
		}
	}
	if s, _ := b.svc.Get(ctx, paid.ID); s.Status != payments.StatusCompleted {
		t.Errorf("the approved session is %s, want Completed", s.Status)
	}
	if s, _ := b.svc.Get(ctx, old.ID); s.Status != payments.StatusRegistered {
		t.Errorf("the session outside the window is %s, want it untouched", s.Status)
	}
	if n := b.sim.CallCount(gatewaysim.OpFind) - findsBefore; n != 2 {
		t.Errorf("%d finds at the gateway, want 2 (the sessions in the window)", n)
	}
	var owner string
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(max(replica_id), '') FROM gateway_calls WHERE operation = 'find'`).Scan(&owner); err != nil ||
		!regexp.MustCompile(`^ops-host/reconcile-\d+-[A-Z2-7]{8}$`).MatchString(owner) {
		t.Errorf("the run's calls are logged as %q (%v), want ops-host/reconcile-<pid>-<random>", owner, err)
	}
	var leases int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM maintenance_leaders`).Scan(&leases); err != nil || leases != 0 {
		t.Errorf("%d lease rows after the run (%v), want it given back", leases, err)
	}

	code, out, _ = b.run(t, b.env)
	if code != 0 || !strings.Contains(out, "checked 2 sessions: 1 late payment, 0 duplicate gateway payments, 0 mismatches, 0 driven, 0 errors; 0 cases opened") ||
		strings.Contains(out, "opened  case") {
		t.Fatalf("second run (default --since): exit %d\n%s", code, out)
	}
}

// TestReconcileCommandWhileAnotherReplicaRuns: while a patrol's reconciliation is in flight
// (parked at the gateway), the command says who runs, compares nothing and exits 75; once that
// run is over, the same command takes the lease from the idle leader and exits 0.
func TestReconcileCommandWhileAnotherReplicaRuns(t *testing.T) {
	t.Parallel()
	b := newReconcileBench(t)
	b.create(t, "rc-1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if err := b.sim.Pause(gatewaysim.OpFind); err != nil {
		t.Fatal(err)
	}
	patrol := make(chan error, 1)
	go func() {
		rep, err := b.svc.ReconcileOnce(context.Background())
		if err == nil && (!rep.Leader || rep.Checked != 1) {
			err = fmt.Errorf("the patrol's run: %+v", rep)
		}
		patrol <- err
	}()
	if err := b.sim.WaitParked(ctx, gatewaysim.OpFind, 1); err != nil {
		t.Fatalf("the patrol never reached the gateway: %v", err)
	}
	code, out, stderr := b.run(t, b.env, "--since", "1h")
	if code != ExitLeaseHeld || out != "" || stderr != "pitlane reconcile: replica-b is reconciling right now (it holds the one-runner lease); nothing was compared; try again in a minute\n" {
		t.Fatalf("while replica-b runs: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if n := b.sim.CallCount(gatewaysim.OpFind); n != 1 {
		t.Fatalf("%d finds, want only the patrol's", n)
	}
	b.sim.Release(gatewaysim.OpFind)
	select {
	case err := <-patrol:
		if err != nil {
			t.Fatalf("patrol: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the patrol did not finish")
	}

	code, out, stderr = b.run(t, b.env, "--since", "1h")
	if code != 0 || !strings.Contains(out, "checked 1 sessions:") {
		t.Fatalf("after the patrol's run: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
}

// TestReconcileCommandGatewayDownExitsOne: every find fails; the run stops after three failures
// in a row, prints them, and exits 1.
func TestReconcileCommandGatewayDownExitsOne(t *testing.T) {
	t.Parallel()
	b := newReconcileBench(t)
	for _, order := range []string{"rc-1", "rc-2", "rc-3", "rc-4"} {
		b.create(t, order)
	}
	b.sim.FailNext(gatewaysim.OpFind, 100)
	code, out, stderr := b.run(t, b.env)
	if code != 1 || strings.Count(out, "found   error") != 3 || !strings.Contains(out, "3 errors") ||
		!strings.Contains(stderr, "stopped after 3 failures in a row") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	if n := b.sim.CallCount(gatewaysim.OpFind); n != 3 {
		t.Errorf("%d finds, want 3 (it stops after three failures in a row)", n)
	}
}

func TestReconcileCommandUsage(t *testing.T) {
	t.Parallel()
	gwEnv := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k"}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{gwEnv, []string{"--since", "a while"}, "usage: pitlane reconcile"},
		{gwEnv, []string{"--since", "-1h"}, "--since must be positive"},
		{gwEnv, []string{"now"}, "usage: pitlane reconcile"},
		{map[string]string{}, nil, "DATABASE_URL"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x"}, nil, "GATEWAY_URL: required by `pitlane reconcile`"},
	} {
		b := &reconcileBench{}
		code, _, stderr := b.run(t, tc.env, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v %v: exit %d, stderr %q; want 2 and one line with %q", tc.env, tc.args, code, stderr, tc.want)
		}
	}
}

func TestReconcileOwnerFitsTheLeaseColumn(t *testing.T) {
	t.Parallel()
	if got := reconcileOwner("web-1", "42-ab12cd34"); got != "web-1/reconcile-42-ab12cd34" {
		t.Errorf("owner %q", got)
	}
	if got := reconcileOwner(strings.Repeat("r", 128), "4194304-ab12cd34"); len(got) != 128 || !strings.HasSuffix(got, "/reconcile-4194304-ab12cd34") {
		t.Errorf("owner of a 128-character REPLICA_ID: %q (%d characters)", got, len(got))
	}
	// Cut on a character's boundary: 42 "€" are 126 bytes, and a cut inside one was refused by
	// PostgreSQL on every run (an outside review).
	if got := reconcileOwner(strings.Repeat("€", 42), "4194304-ab12cd34"); len(got) > 128 || !utf8.ValidString(got) || !strings.HasSuffix(got, "/reconcile-4194304-ab12cd34") {
		t.Errorf("owner of a REPLICA_ID of 42 euro signs: %q (%d bytes)", got, len(got))
	}
}

// `pitlane reconcile` leaves a Registering session to the Create registering it for
// StaleAfterFor(GATEWAY_TIMEOUT), as serve's patrol does; it built its service without
// GATEWAY_TIMEOUT, so with a slow gateway (60 s) it took over registrations serve was still
// waiting for after the default's 30 s (an outside review noted it).
func TestReconcileCommandLeavesRegistrationsInFlightToServe(t *testing.T) {
	t.Parallel()
	b := newReconcileBench(t)
	ctx := context.Background()
	s := b.create(t, "rc-in-flight")
	// As a registration whose answer is still on its way: Registering, no id, 40 s old.
	if _, err := b.pool.Exec(ctx, `UPDATE payment_sessions SET status = 'Registering', gateway_payment_id = NULL, confirmation_url = NULL,
		created_at = now() - interval '40 seconds', updated_at = now() - interval '1 second' WHERE id = $1`, s.ID); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"GATEWAY_TIMEOUT": "60s"}
	for k, v := range b.env {
		env[k] = v
	}
	code, out, stderr := b.run(t, env, "--since", "1h")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr: %s", code, out, stderr)
	}
	var status string
	if err := b.pool.QueryRow(ctx, `SELECT status FROM payment_sessions WHERE id = $1`, s.ID).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "Registering" || !strings.Contains(out, "checked 0 sessions") {
		t.Fatalf("a registration 40 s in flight under GATEWAY_TIMEOUT=60s: %s after reconcile, stdout:\n%s", status, out)
	}
}
