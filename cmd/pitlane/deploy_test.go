package main

// Checks of the examples in deploy/: they must work with the code as it is, not only read well.

import (
	"bufio"
	"context"
	"log/slog"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/config"
	"pitlane/internal/pgbouncer"
	"pitlane/internal/testdb"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
	"pitlane/web"
)

// readConf reads an ini-style file (pgbouncer's, systemd's): section → key → values in order
// (systemd allows a key more than once). Comments start with ';' or '#'.
func readConf(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conf := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, ";") || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			conf[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key = value in a section: %q", path, n, line)
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			conf[section][k] = append(conf[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return conf
}

// exampleURL is the DATABASE_URL example a file shows (in a comment or as a setting).
func exampleURL(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`DATABASE_URL=(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s shows no DATABASE_URL=…", path)
	}
	return string(m[1])
}

// TestDeployPgbouncerINI: deploy/pgbouncer.ini is transaction pooling, the DATABASE_URL it and
// the environment example show is a URL pitlane accepts with default_query_exec_mode=exec, and
// pgbouncer started with the example's settings (only where it listens, how clients
// authenticate and where it logs replaced) accepts them and serves pitlane's core: concurrent
// Creates of one order from two pools (advisory xact locks after SET LOCAL) make one session and
// one registration, Check applies the success once, and the reconciliation lease is taken and
// given back through it. The negative control: the same settings with one bad value are refused.
func TestDeployPgbouncerINI(t *testing.T) {
	t.Parallel()
	conf := readConf(t, "../../deploy/pgbouncer.ini")
	settings := map[string]string{}
	for k, v := range conf["pgbouncer"] {
		settings[k] = v[len(v)-1]
	}
	if settings["pool_mode"] != "transaction" {
		t.Fatalf("pool_mode %q, want transaction", settings["pool_mode"])
	}
	if len(conf["databases"]["pitlane"]) != 1 {
		t.Fatalf("[databases] %v, want a pool named pitlane", conf["databases"])
	}
	for _, file := range []string{"../../deploy/pgbouncer.ini", "../../deploy/pitlane.env.example"} {
		url := exampleURL(t, file)
		cfg, err := config.Load(func(k string) string { return map[string]string{"DATABASE_URL": url}[k] })
		if err != nil {
			t.Fatalf("%s: DATABASE_URL %s: %v", file, url, err)
		}
		pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
		if err != nil || pc.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeExec || pc.ConnConfig.Port != 6432 {
			t.Fatalf("%s: DATABASE_URL %s: %v; want port 6432 and default_query_exec_mode=exec", file, url, err)
		}
	}

	url := testdb.NewURL(t)
	through, err := pgbouncer.StartWith(t, url, settings)
	if err != nil {
		t.Fatalf("pgbouncer with deploy/pgbouncer.ini's settings: %v", err)
	}
	// Each replica connects with an example's DATABASE_URL as shipped (sslmode=require,
	// default_query_exec_mode=exec): only where pgbouncer listens, the credentials and the
	// database are the test's. The examples said sslmode=require to a pgbouncer that had no
	// certificate, and no replica could connect (pgbouncer review, session 30).
	tu, err := neturl.Parse(through)
	if err != nil {
		t.Fatal(err)
	}
	asShipped := func(file string) *pgxpool.Pool {
		ex, err := neturl.Parse(exampleURL(t, file))
		if err != nil {
			t.Fatal(err)
		}
		ex.Host, ex.User, ex.Path = tu.Host, tu.User, tu.Path
		cfg, err := config.Load(func(k string) string { return map[string]string{"DATABASE_URL": ex.String()}[k] })
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		pool, err := openPool(context.Background(), cfg.DatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if err := pool.Ping(context.Background()); err != nil {
			t.Fatalf("%s: its DATABASE_URL (sslmode=%s) through pgbouncer with deploy/pgbouncer.ini's settings: %v", file, ex.Query().Get("sslmode"), err)
		}
		return pool
	}
	clock := payments.NewManualClock(time.Now())
	gw := fakegw.New()
	newSvc := func(replica, file string) *payments.Service {
		return payments.NewService(asShipped(file), payments.Config{Gateway: gw, Clock: clock, ReplicaID: replica,
			CodeSecret: []byte("test-secret"), LockTimeout: 10 * time.Second})
	}
	a, b := newSvc("bounced-a", "../../deploy/pitlane.env.example"), newSvc("bounced-b", "../../deploy/pgbouncer.ini")
	ctx := context.Background()
	actor := payments.Actor{Kind: payments.ActorAPI, ID: "t"}
	in := payments.CreateInput{OrderID: "deploy-1", Amount: 1999, Currency: "EUR", CustomerContact: "c@example.com"}
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = map[string]bool{}
	)
	start := make(chan struct{})
	for i := range 10 {
		svc := a
		if i%2 == 1 {
			svc = b
		}
		wg.Go(func() {
			<-start
			r, err := svc.Create(ctx, actor, in)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			ids[r.Session.ID] = true
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if len(ids) != 1 || gw.Calls(fakegw.OpRegister) != 1 {
		t.Fatalf("10 concurrent creates through pgbouncer: %d sessions, %d registrations; want 1, 1", len(ids), gw.Calls(fakegw.OpRegister))
	}
	for id := range ids {
		s, err := a.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		gw.SetStatus(s.GatewayPaymentID, payments.GatewaySucceeded)
		for _, svc := range []*payments.Service{a, b} {
			if s, err := svc.Check(ctx, actor, id); err != nil || s.Status != payments.StatusCompleted {
				t.Fatalf("check through pgbouncer: %s %v", s.Status, err)
			}
		}
	}
	clock.Advance(time.Minute)
	if rep, err := b.ReconcileSince(ctx, time.Hour, payments.ReconcileConfig{}); err != nil || !rep.Leader || rep.Checked != 1 {
		t.Fatalf("reconcile through pgbouncer: %+v %v", rep, err)
	}
	var ledger, leases int
	if err := testdb.Pool(t, url).QueryRow(ctx, `SELECT (SELECT count(*) FROM accounting_entries), (SELECT count(*) FROM maintenance_leaders)`).
		Scan(&ledger, &leases); err != nil || ledger != 1 || leases != 0 {
		t.Fatalf("%d ledger entries, %d leases (%v); want 1, 0", ledger, leases, err)
	}

	// A statement cut at its bound (here a DELETE waiting on a held row) through these settings,
	// over the shipped sslmode=require: the cancel request reaches the server (the row is still
	// there) and pgbouncer lives on. pgx's own cancel handling crashed pgbouncer 1.18 at the first
	// cut (payments/dbconn).
	held := testdb.Pool(t, url)
	if _, err := held.Exec(ctx, `CREATE TABLE cut_probe (id int PRIMARY KEY); INSERT INTO cut_probe VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	holder, err := held.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT FROM cut_probe FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	replica := asShipped("../../deploy/pitlane.env.example")
	for range 3 {
		cut, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, cutErr := replica.Exec(cut, `DELETE FROM cut_probe`)
		cancel()
		if cutErr == nil {
			t.Fatal("a DELETE went through a held row")
		}
		if err := replica.Ping(ctx); err != nil {
			t.Fatalf("after a cut statement (%v) pgbouncer does not answer: %v", cutErr, err)
		}
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := held.QueryRow(ctx, `SELECT count(*) FROM cut_probe`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d rows (%v) after the cut DELETEs; want the row still there", rows, err)
	}

	// Negative control: pgbouncer refuses a configuration it cannot read, and StartWith says so.
	broken := map[string]string{}
	for k, v := range settings {
		broken[k] = v
	}
	broken["pool_mode"] = "transactions"
	if _, err := pgbouncer.StartWith(t, url, broken); err == nil || !strings.Contains(err.Error(), "pool_mode") {
		t.Fatalf("a bad pool_mode: %v; want pgbouncer's refusal naming it", err)
	}
}

// TestDeploySystemdUnit: deploy/pitlane.service runs `pitlane serve` from its environment file
// as a user of its own, stops it with SIGTERM and waits longer than the server's shutdown grace
// plus a gateway call and the release of leases before SIGKILL, does not restart a bad setting
// (exit 2), and systemd-analyze finds nothing wrong with it.
func TestDeploySystemdUnit(t *testing.T) {
	t.Parallel()
	const path = "../../deploy/pitlane.service"
	unit := readConf(t, path)
	svc := unit["Service"]
	one := func(k string) string {
		t.Helper()
		if len(svc[k]) != 1 {
			t.Fatalf("[Service] %s = %q, want one value", k, svc[k])
		}
		return svc[k][0]
	}
	if f := strings.Fields(one("ExecStart")); len(f) != 2 || filepath.Base(f[0]) != "pitlane" || f[1] != "serve" {
		t.Errorf("ExecStart %q, want pitlane serve", one("ExecStart"))
	}
	if one("EnvironmentFile") == "" || one("KillSignal") != "SIGTERM" || one("Restart") != "on-failure" || one("RestartPreventExitStatus") != "2" {
		t.Errorf("EnvironmentFile %q, KillSignal %q, Restart %q, RestartPreventExitStatus %q",
			one("EnvironmentFile"), one("KillSignal"), one("Restart"), one("RestartPreventExitStatus"))
	}
	if one("DynamicUser") != "yes" || one("NoNewPrivileges") != "yes" || one("ProtectSystem") != "strict" || one("CapabilityBoundingSet") != "" {
		t.Errorf("hardening: DynamicUser %q NoNewPrivileges %q ProtectSystem %q CapabilityBoundingSet %q",
			one("DynamicUser"), one("NoNewPrivileges"), one("ProtectSystem"), one("CapabilityBoundingSet"))
	}
	stop, err := time.ParseDuration(one("TimeoutStopSec"))
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	defaults, err := config.Load(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	grace := shutdownGraceFor(defaults.GatewayTimeout) + web.WriteMargin // the cut requests' answers
	patrol := patrolStopBoundFor(defaults.GatewayTimeout)
	// The environment example's SHUTDOWN_DRAIN (commented out) comes first, when set (a review:
	// the example's drain passed the unit's timeout).
	var drain time.Duration
	example, err := os.ReadFile("../../deploy/pitlane.env.example")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^#?SHUTDOWN_DRAIN=(\S+)$`).FindStringSubmatch(string(example)); m == nil {
		t.Error("the environment example shows no SHUTDOWN_DRAIN")
	} else if drain, err = time.ParseDuration(m[1]); err != nil {
		t.Fatalf("the example's SHUTDOWN_DRAIN: %v", err)
	}
	if need := drain + grace + patrol + tracingFlushTimeout + poolCloseBound; stop <= need {
		t.Errorf("TimeoutStopSec %s: systemd would SIGKILL a draining server; want more than %s (the example's drain %s + grace %s + the patrol's stop %s + last spans %s + the pool's close %s)",
			stop, need, drain, grace, patrol, tracingFlushTimeout, poolCloseBound)
	}

	// systemd's own reading of the unit, with ExecStart pointing at a binary that exists here.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze not found: run `make test` (it installs it) or `apt-get install -y systemd`")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyPath := filepath.Join(dir, "pitlane.service")
	text := regexp.MustCompile(`(?m)^ExecStart=\S+`).ReplaceAllString(string(raw), "ExecStart="+self)
	if err := os.WriteFile(copyPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", copyPath).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// The retention timer's service runs `pitlane prune` with arguments the command takes (it gets as
// far as wanting DATABASE_URL), and systemd reads both units as they ship.
func TestDeployPruneTimer(t *testing.T) {
	t.Parallel()
	const servicePath, timerPath = "../../deploy/pitlane-prune.service", "../../deploy/pitlane-prune.timer"
	svc := readConf(t, servicePath)["Service"]
	if len(svc["ExecStart"]) != 1 || len(svc["EnvironmentFile"]) != 1 || len(svc["Type"]) != 1 || svc["Type"][0] != "oneshot" {
		t.Fatalf("[Service] ExecStart %q EnvironmentFile %q Type %q", svc["ExecStart"], svc["EnvironmentFile"], svc["Type"])
	}
	f := strings.Fields(svc["ExecStart"][0])
	if len(f) < 2 || filepath.Base(f[0]) != "pitlane" || f[1] != "prune" {
		t.Fatalf("ExecStart %q, want pitlane prune", svc["ExecStart"][0])
	}
	var stdout, stderr strings.Builder
	env := &Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" },
		Logger: slog.New(slog.DiscardHandler)}
	if code := Main(f[1:], env); code != 2 || !strings.Contains(stderr.String(), "DATABASE_URL") {
		t.Fatalf("pitlane %s without a database: exit %d, %q; want the arguments taken and DATABASE_URL asked for", strings.Join(f[1:], " "), code, stderr.String())
	}
	if timer := readConf(t, timerPath)["Timer"]; len(timer["OnCalendar"]) != 1 {
		t.Fatalf("[Timer] OnCalendar %q", timer["OnCalendar"])
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze not found: run `make test` (it installs it) or `apt-get install -y systemd`")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, p := range []string{servicePath, timerPath} {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		text := regexp.MustCompile(`(?m)^ExecStart=\S+`).ReplaceAllString(string(raw), "ExecStart="+self)
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(p)), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(analyze, "verify", filepath.Join(dir, "pitlane-prune.service"), filepath.Join(dir, "pitlane-prune.timer")).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// Requests in flight at a stop get at least one gateway call's time (audit 6: with
// GATEWAY_TIMEOUT=30s a Create waiting at the gateway was cut after a fixed 15 s).
func TestShutdownGraceFollowsTheGatewayTimeout(t *testing.T) {
	for timeout, want := range map[time.Duration]time.Duration{
		time.Second: shutdownGrace, 10 * time.Second: shutdownGrace, 30 * time.Second: 35 * time.Second,
	} {
		if got := shutdownGraceFor(timeout); got != want {
			t.Errorf("grace for GATEWAY_TIMEOUT %s = %s, want %s", timeout, got, want)
		}
	}
}
