// Command bench is pitlane's benchmark (`make bench`, or `go run ./internal/bench`): every figure
// beside its anchor, measured in one run on a private PostgreSQL started from the machine's own
// binaries (internal/pgrunner), printed as a table and written to .pitlane/bench/report.json as
// a list of {"name","value","unit","anchor","anchor_value","ratio","target","verdict"}.
//
// These machines are noisy and small: a figure alone says little, so each is a ratio to an anchor
// taken in the same run, on the same cluster (the physical ideal, or a well-kept library doing the
// same work). The program reports; nothing asserts a time. `make test` runs it small once
// (BENCH_SCALE=small, through TestBenchSmall) to prove it still works, without verdicts.
//
// Settings: BENCH_SCALE=small (default full), BENCH_OUT (default .pitlane/bench/report.json; the
// same table in Markdown, with the run's commit, time and machine, goes beside it as report.md,
// and a full run of every figure is also kept as last-full.json and last-full.md, which a later
// partial run does not overwrite), BENCH_FIGURES (comma-separated figure names to run; default all), BENCH_MEMORY_ORDERS (the
// memory figure's order count, default 200,000), BENCH_PROFILE=DIR (write a
// Go CPU profile and the cluster's pg_stat_statements top list there: where a missed target is
// looked into).
//
// Adding a figure: write `func(ctx context.Context, env *Env) ([]Figure, error)` in its own file
// and list it in figures below.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // "pgx" database/sql driver for the migrations

	"pitlane/internal/pgrunner"
	"pitlane/migrations"
)

// figure is one function of the program: it measures and returns its figures.
type figure struct {
	name string
	run  func(ctx context.Context, env *Env) ([]Figure, error)
}

// figures is the program, in the order it runs.
var figures = []figure{
	{"create", createFigures},
	{"clicks", clickFigures},
	{"storm", duplicateStorm},
	{"idempotency", idempotencyOverhead},
	{"locks", lockIndependence},
	{"api", apiCreate},
	{"memory", residentMemory},
	{"console", consoleAtScale},
	{"sweeper", sweeperDrain},
	{"replicas", apiCreates},
	// Last: a report-only curve whose many short rounds and databases must not disturb the
	// judged figures (autovacuum, checkpoints).
	{"create-sweep", createSweep},
}

// Env is what a figure gets: the scale, a log, and fresh databases on the run's cluster.
type Env struct {
	Scale string // "full" or "small"
	Log   io.Writer
	// Getenv reads a setting of the run (a figure may have its own, e.g. BENCH_LATENCIES).
	Getenv func(string) string
	// binary is the pitlane binary the HTTP figures run (built once); cleanup runs at the end.
	binary  string
	servers int // how many servers the run started (their BENCH_PROFILE files are numbered)
	cleanup []func()
	// newDB creates a fresh database on the run's server and returns its URL; migrate applies
	// pitlane's migrations to it.
	newDB func(ctx context.Context, migrate bool) (string, error)
	// quiet, when set, runs between figures: it drops the databases the last figure created and
	// waits for the cluster to be quiet, so no figure is measured while autovacuum cleans up
	// after the one before it.
	quiet func(ctx context.Context)
}

// Size picks a size by scale.
func (e *Env) Size(small, full int) int {
	if e.Scale == "small" {
		return small
	}
	return full
}

// NewDatabase returns the URL of a fresh database (pitlane's schema when migrate is set).
func (e *Env) NewDatabase(ctx context.Context, migrate bool) (string, error) {
	return e.newDB(ctx, migrate)
}

// Logf writes a progress line.
func (e *Env) Logf(format string, args ...any) { fmt.Fprintf(e.Log, format+"\n", args...) }

// Pool opens a pool of at most maxConns connections on url.
func Pool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	return pgxpool.NewWithConfig(ctx, cfg)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Getenv, os.Stdout, os.Stderr))
}

func run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) int {
	scale := getenv("BENCH_SCALE")
	if scale == "" {
		scale = "full"
	}
	if scale != "full" && scale != "small" {
		fmt.Fprintf(stderr, "BENCH_SCALE: must be full or small, got %q\n", scale)
		return 2
	}
	figs, err := selected(getenv("BENCH_FIGURES"))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	out := getenv("BENCH_OUT")
	if out == "" {
		out = ".pitlane/bench/report.json"
	}
	opts := pgrunner.Throwaway()
	profile := getenv("BENCH_PROFILE")
	if profile != "" {
		opts.Settings = maps.Clone(opts.Settings)
		opts.Settings["shared_preload_libraries"] = "pg_stat_statements"
		opts.Settings["pg_stat_statements.track"] = "all"
	}
	cluster, err := pgrunner.Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "bench: private PostgreSQL: %v\n", err)
		return 1
	}
	defer cluster.Stop()
	if profile != "" {
		stopProfile, err := startProfile(ctx, profile, cluster.URL("postgres"))
		if err != nil {
			fmt.Fprintf(stderr, "bench: profile: %v\n", err)
			return 1
		}
		defer stopProfile()
	}
	seq := 0
	var made []string // databases of the figure running now
	env := &Env{Scale: scale, Log: stderr, Getenv: getenv, newDB: func(ctx context.Context, migrate bool) (string, error) {
		seq++
		name := fmt.Sprintf("bench_%d", seq)
		made = append(made, name)
		url, err := cluster.EnsureDatabase(ctx, name)
		if err != nil {
			return "", err
		}
		if migrate {
			if err := migrateURL(ctx, url); err != nil {
				return "", err
			}
		}
		return url, nil
	}}
	env.quiet = func(ctx context.Context) {
		if err := quietCluster(ctx, cluster.URL("postgres"), made); err != nil {
			env.Logf("bench: quieting the cluster between figures: %v", err)
		}
		made = nil
	}
	version := serverVersion(ctx, cluster.URL("postgres"))
	fmt.Fprintf(stdout, "pitlane bench: scale %s, %d CPU cores, PostgreSQL %s (private, fsync off)\n", scale, runtime.NumCPU(), version)
	meta := RunMeta{Started: time.Now().UTC(), Commit: sourceCommit(ctx), Scale: scale, Cores: runtime.NumCPU(), PostgreSQL: version, Figures: names(figs)}
	rep, err := measure(ctx, env, figs)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	meta.Finished = time.Now().UTC()
	judge := scale == "full"
	rep.Print(stdout, judge)
	written, err := rep.Write(out, meta, judge, scale == "full" && len(figs) == len(figures))
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "report: %s\n", strings.Join(written, ", "))
	return 0
}

// selected returns the figures named in list (all when empty), in the program's order. A name
// that is no figure is refused: a typo would otherwise run nothing and write an empty report.
func selected(list string) ([]figure, error) {
	if strings.TrimSpace(list) == "" {
		return figures, nil
	}
	wanted := strings.Split(list, ",")
	for i, name := range wanted {
		wanted[i] = strings.TrimSpace(name)
		if !slices.ContainsFunc(figures, func(f figure) bool { return f.name == wanted[i] }) {
			return nil, fmt.Errorf("BENCH_FIGURES: no figure %q; the figures are %s", wanted[i], strings.Join(names(figures), ","))
		}
	}
	var out []figure
	for _, f := range figures {
		if slices.Contains(wanted, f.name) {
			out = append(out, f)
		}
	}
	return out, nil
}

// sourceCommit names the commit of the source the bench runs from ("+dirty" with local changes
// to tracked files; "unknown" outside a git work tree).
func sourceCommit(ctx context.Context) string {
	head, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(head))
	if changed, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(changed)) > 0 {
		commit += "+dirty"
	}
	return commit
}

// names lists the figures' names.
func names(figs []figure) []string {
	out := make([]string, len(figs))
	for i, f := range figs {
		out[i] = f.name
	}
	return out
}

// measure runs the figures one after another (never in parallel: they would measure each other).
func measure(ctx context.Context, env *Env, figs []figure) (Report, error) {
	var rep Report
	defer func() {
		for _, f := range env.cleanup {
			f()
		}
	}()
	for _, f := range figs {
		started := time.Now()
		env.Logf("bench: %s …", f.name)
		var got []Figure
		var err error
		// The figure's name labels its goroutines in a BENCH_PROFILE profile (pprof -tagfocus).
		pprof.Do(ctx, pprof.Labels("figure", f.name), func(ctx context.Context) { got, err = f.run(ctx, env) })
		if err != nil {
			return rep, fmt.Errorf("%s: %w", f.name, err)
		}
		env.Logf("bench: %s done in %s", f.name, time.Since(started).Round(time.Second))
		rep.Figures = append(rep.Figures, got...)
		if env.quiet != nil {
			env.quiet(ctx)
		}
	}
	return rep, nil
}

// serverVersion asks the server its version, for the report's header.
func serverVersion(ctx context.Context, url string) string {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "?"
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&v); err != nil {
		return "?"
	}
	return v
}

func migrateURL(ctx context.Context, url string) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = migrations.Up(ctx, db)
	return err
}

// quietCluster drops the given databases (a finished figure's: their rows would otherwise keep
// autovacuum busy during the next figure — after the create figure's tens of thousands of
// sessions it doubled the duplicate storm's p99), takes a checkpoint, and waits up to a minute
// for no autovacuum worker to be running. Between figures only: nothing of a figure's own
// cleanup is hidden from it.
func quietCluster(ctx context.Context, adminURL string, dbs []string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, db := range dbs {
		if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{db}.Sanitize()+` WITH (FORCE)`); err != nil {
			return fmt.Errorf("drop %s: %w", db, err)
		}
	}
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		return err
	}
	// Polling: a benchmark between its figures, not a test waiting for an event.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}
