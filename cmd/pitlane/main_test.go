package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/internal/testdb"
	"pitlane/payments"
)

// The test binary doubles as the pitlane binary: with this variable set it runs Main on its
// arguments. With PITLANE_TEST_GATE=1 it first waits for its stdin to close, so that a test
// can release several processes at the same instant.
const mainEnv = "PITLANE_TEST_MAIN"

func TestMain(m *testing.M) {
	// Password hashes in tests need not be slow (each hash carries its cost, so verification is
	// the same code path); bcrypt at the real cost takes seconds under -race.
	access.DefaultPasswordCost = bcrypt.MinCost
	if os.Getenv(mainEnv) == "1" {
		if os.Getenv("PITLANE_TEST_GATE") == "1" {
			os.Stdout.WriteString("gate\n")
			_, _ = io.Copy(io.Discard, os.Stdin)
		}
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// pitlane prepares the binary (this test binary) with a clean pitlane environment plus env.
func pitlane(env map[string]string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "DATABASE_URL", "HTTP_ADDR", "PUBLIC_BASE_URL", "GATEWAY", "GATEWAY_URL", "GATEWAY_API_KEY",
			"GATEWAY_WEBHOOK_SECRET", "GATEWAY_TIMEOUT", "NOTIFY_WEBHOOK_URL", "REPLICA_ID", "SWEEP_INTERVAL", "SWEEP_CONCURRENCY", "SECRET_KEY", "LISTEN_DATABASE_URL",
			"EVENTS_WEBHOOK_URL", "EVENTS_WEBHOOK_SECRET":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, mainEnv+"=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

func TestConcurrentMigrateFromThreeProcesses(t *testing.T) {
	t.Parallel()
	url := testdb.NewEmptyURL(t)

	type proc struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout *bufio.Reader
		stderr bytes.Buffer
	}
	procs := make([]*proc, 3)
	for i := range procs {
		p := &proc{cmd: pitlane(map[string]string{"DATABASE_URL": url, "PITLANE_TEST_GATE": "1"}, "migrate")}
		var err error
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		p.stdout = bufio.NewReader(out)
		p.cmd.Stderr = &p.stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.cmd.Process.Kill() })
		procs[i] = p
	}
	// Every process is loaded and waiting at the gate: open it for all three at once.
	for _, p := range procs {
		if line, err := p.stdout.ReadString('\n'); err != nil || line != "gate\n" {
			t.Fatalf("process not at the gate: %q %v", line, err)
		}
	}
	for _, p := range procs {
		p.stdin.Close()
	}
	applied := 0
	for i, p := range procs {
		rest, _ := io.ReadAll(p.stdout)
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("migrate #%d: %v\nstdout: %s\nstderr: %s", i, err, rest, p.stderr.String())
		}
		if strings.Contains(string(rest), "applied 0 migration") {
			continue
		}
		applied++
	}
	if applied != 1 {
		t.Errorf("%d processes applied migrations, want exactly 1 (the others find the schema current)", applied)
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var dup int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT version_id FROM goose_db_version
		WHERE version_id > 0 GROUP BY version_id HAVING count(*) > 1) d`).Scan(&dup); err != nil {
		t.Fatal(err)
	}
	if dup != 0 {
		t.Errorf("%d migrations recorded more than once", dup)
	}
	files, _ := filepath.Glob("../../migrations/*.sql")
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM goose_db_version WHERE version_id > 0`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(files) {
		t.Errorf("%d migrations recorded, %d embedded", n, len(files))
	}

	// Current: a fourth run is a no-op with exit 0.
	out, err := pitlane(map[string]string{"DATABASE_URL": url}, "migrate").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "applied 0 migration") {
		t.Fatalf("migrate on a current schema: %v %s", err, out)
	}
}

func TestInvalidSettingsExitTwoWithOneLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"serve"}, "DATABASE_URL"},
		{nil, []string{"migrate"}, "DATABASE_URL"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "HTTP_ADDR": "nonsense"}, []string{"serve"}, "HTTP_ADDR"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "GATEWAY": "paypal"}, []string{"serve"}, "GATEWAY"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "GATEWAY_TIMEOUT": "soon"}, []string{"serve"}, "GATEWAY_TIMEOUT"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "SWEEP_INTERVAL": "-2s"}, []string{"serve"}, "SWEEP_INTERVAL"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "SECRET_KEY": "short"}, []string{"serve"}, "SECRET_KEY"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "PUBLIC_BASE_URL": "example.com"}, []string{"serve"}, "PUBLIC_BASE_URL"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "NOTIFY_WEBHOOK_URL": "nope"}, []string{"serve"}, "NOTIFY_WEBHOOK_URL"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "REPLICA_ID": "a b"}, []string{"serve"}, "REPLICA_ID"},
		{map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "EVENTS_WEBHOOK_URL": "https://shop.example/hook"}, []string{"serve"}, "EVENTS_WEBHOOK_SECRET"},
		{map[string]string{"DATABASE_URL": "postgres://x:pw@h:port/x"}, []string{"migrate"}, "DATABASE_URL"},
		{map[string]string{"GATEWAY_URL": "not a url"}, []string{"dev"}, "GATEWAY_URL"},
		{nil, []string{"migrate", "extra"}, "no arguments"},
		{nil, []string{"frobnicate"}, "unknown command"},
		{nil, nil, "usage"},
	} {
		var stdout, stderr bytes.Buffer
		env := &Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
			Getenv: func(k string) string { return tc.env[k] }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		code := Main(tc.args, env)
		if code != 2 {
			t.Errorf("%v %v: exit %d, want 2 (stderr %q)", tc.args, tc.env, code, stderr.String())
			continue
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v %v: stderr %q does not name %s", tc.args, tc.env, stderr.String(), tc.want)
		}
		if tc.args != nil && strings.Count(strings.TrimRight(stderr.String(), "\n"), "\n") != 0 {
			t.Errorf("%v %v: want one line on stderr, got %q", tc.args, tc.env, stderr.String())
		}
	}

	// The same through a real process: exit status 2, one line, no panic.
	cmd := pitlane(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "HTTP_ADDR": "nonsense"}, "serve")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if cmd.ProcessState.ExitCode() != 2 {
		t.Fatalf("process exit %v, want 2; stderr %q", err, stderr.String())
	}
	if got := stderr.String(); !strings.HasPrefix(got, "pitlane serve: HTTP_ADDR: ") || strings.Count(got, "\n") != 1 {
		t.Fatalf("stderr %q: want one line naming HTTP_ADDR", got)
	}
}

// Every command's -h prints its usage and exits 0 (audit 6: migrate and serve answered "takes no
// arguments", dev and reconcile "flag: help requested", all with exit 2).
func TestEveryCommandHelpExitsZero(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		for _, h := range []string{"-h", "--help"} {
			var stdout, stderr bytes.Buffer
			env := &Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
				Getenv: func(string) string { return "" }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if code := Main([]string{c.name, h}, env); code != 0 {
				t.Errorf("pitlane %s %s: exit %d (stderr %q), want 0", c.name, h, code, stderr.String())
			}
			if !strings.Contains(stdout.String()+stderr.String(), "usage") && !strings.Contains(stdout.String()+stderr.String(), "Usage") {
				t.Errorf("pitlane %s %s: no usage in %q %q", c.name, h, stdout.String(), stderr.String())
			}
		}
	}
}

func TestServeAnswersAndShutsDownGracefully(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "SECRET_KEY": strings.Repeat("s", 32),
			"GATEWAY_URL": "http://127.0.0.1:1", "GATEWAY_API_KEY": "k"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	var synced <-chan struct{}
	base, stop := startServeWith(t, cfg, pool, slog.New(slog.NewTextHandler(io.Discard, nil)),
		serveOptions{clock: func(c *payments.DatabaseClock) { synced = c.Synced() }})
	// /readyz answers ready once the database's clock was first read: the listener may be up
	// before that (a busy machine: the CI run that found this test's race).
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		t.Fatal("the database clock was never read")
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz = %d", resp.StatusCode)
	}
	client.CloseIdleConnections()
	if err := stop(); err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
}

// TestServerNeedsItsGateway: a server without a usable gateway configuration does not start
// (serve refuses it before opening the database, exit 2; a direct caller of the server process
// gets the same error), so no server ever runs without its payment service.
func TestServerNeedsItsGateway(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"HTTP_ADDR": "127.0.0.1:0", "SECRET_KEY": strings.Repeat("s", 32)}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = run(ctx, cfg, testdb.Unreachable(t), slog.New(slog.DiscardHandler), func(string) {
		t.Error("a server without a gateway started")
		cancel()
	})
	var cerr *config.Error
	if !errors.As(err, &cerr) || !strings.Contains(err.Error(), "GATEWAY_URL") {
		t.Fatalf("run without a gateway: %v, want the configuration error naming GATEWAY_URL", err)
	}
}

// startRun runs the server process (run) until stop, which cancels it and returns what run
// returned. base is the URL run announced once it listened.
func startRun(t *testing.T, cfg config.Config, pool *pgxpool.Pool) (base string, stop func() error) {
	t.Helper()
	return startServeWith(t, cfg, pool, slog.New(slog.NewTextHandler(io.Discard, nil)), serveOptions{})
}

// startServeWith is startRun with a logger and options of the test's (opts.ready is set here).
func startServeWith(t *testing.T, cfg config.Config, pool *pgxpool.Pool, logger *slog.Logger, opts serveOptions) (base string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	urls := make(chan string, 1)
	done := make(chan error, 1)
	opts.ready = func(u string) { urls <- u }
	go func() {
		done <- serveWith(ctx, cfg, pool, logger, opts)
	}()
	select {
	case base = <-urls:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	return base, func() error {
		cancel()
		return <-done
	}
}

// devReady waits, within 30 s, for a dev process's /readyz to answer 200. The banner comes once
// the server serves; a readiness probe answers 503 until the database's clock was first read
// and while its own look at the database (2 s) does not come back — on a machine busy with other
// tests, once, right after the banner — and a balancer asks again; so does this.
func devReady(t *testing.T, client *http.Client, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %s", resp.StatusCode, body)
		}
	}
}

// TestDevStartsPrivateDatabaseAndStopsIt runs `pitlane dev` as a process, waits for the URL it
// prints, checks the console is ready, sends SIGTERM and requires a clean exit with the
// private PostgreSQL gone.
func TestDevStartsPrivateDatabaseAndStopsIt(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "pitlane-dev-test-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755) // the postgres OS user must reach it when we are root
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	banner, stop := startDev(t, map[string]string{"HTTP_ADDR": "127.0.0.1:0"}, "dev", "--dir", filepath.Join(dir, ".pitlane"))
	var console, dbURL string
	for _, line := range banner {
		if v, ok := strings.CutPrefix(line, "console:"); ok {
			console = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "database:"); ok {
			dbURL = strings.Fields(v)[0]
		}
	}
	if console == "" || dbURL == "" {
		t.Fatalf("dev printed no console/database URL:\n%s", strings.Join(banner, "\n"))
	}

	client := &http.Client{Timeout: 10 * time.Second}
	devReady(t, client, strings.TrimSuffix(console, "/")+"/readyz")
	checkDevRunning(t, console, dbURL, banner) // dev_test.go: console page, simulator, demo orders
	client.CloseIdleConnections()
	if _, err := os.Stat(filepath.Join(dir, ".pitlane", "secret")); err != nil {
		t.Errorf("dev did not persist its secret: %v", err)
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, dbURL); err == nil {
		conn.Close(ctx)
		t.Fatal("the private PostgreSQL still accepts connections after dev exited")
	}
	if _, err := os.Stat(filepath.Join(dir, ".pitlane", "pg", "postmaster.pid")); err == nil {
		t.Error("postmaster.pid still present: the server did not shut down cleanly")
	}
	checkDevStopped(t, banner)
}

// A database that cannot be reached: one line on stderr that still names the cause (pgx puts
// the refused host and port after a line break; the line used to be cut there).
func TestUnreachableDatabaseNamesTheCause(t *testing.T) {
	t.Parallel()
	code, _, stderr := apikeyMain(map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x?connect_timeout=5"}, "migrate")
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "127.0.0.1:1") ||
		!strings.Contains(stderr, "connection refused") {
		t.Fatalf("exit %d, stderr %q: want 1 and one line naming the host and the refusal", code, stderr)
	}
}
