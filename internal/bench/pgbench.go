package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"pitlane/internal/pgrunner"
)

// The pgbench anchor: what PostgreSQL allows for the core's own statements. pgbench (C, one
// thread per client, prepared statements) runs exactly the statements the core sent for one
// operation — captured from the core itself by a pgx tracer, not written by hand, so the anchor
// cannot drift from the code — with the same number of clients on the same cluster. The
// difference between the two is what the core costs beyond its SQL: Go, pgx, the pool, the
// gateway call, the decisions.
//
// One difference is pgbench's, not ours, and it makes the anchor slower, not faster: pgbench has
// no string variables, so a script whose operation needs fresh ids (a new order, a new session)
// starts with one `SELECT … \gset` that makes them, shaped like the ids of the core's load. A pgx batch (one round trip) becomes a
// \startpipeline block — including the core's BEGIN and SET LOCAL lock_timeout, which travel in
// the pipeline of each transaction's first statement (payments/tx.go).

// pgbenchPath finds pgbench where pgrunner finds initdb (Debian ships it in the server package):
// the bench fails loudly, naming the package, when it is missing.
func pgbenchPath() (string, error) {
	bin, err := pgrunner.FindBinaries(pgrunner.DefaultSearch())
	if err != nil {
		return "", err
	}
	return bin.Tool("pgbench")
}

// statement is one statement the core sent: its SQL, its arguments, and the pgx batch it was
// part of (0: sent alone).
type statement struct {
	sql   string
	args  []any
	batch int
}

// recorder is a pgx tracer that writes down every statement sent while it is on.
type recorder struct {
	mu      sync.Mutex
	on      bool
	batches int
	stmts   []statement
}

func (r *recorder) start() {
	r.mu.Lock()
	r.on, r.stmts = true, nil
	r.mu.Unlock()
}

func (r *recorder) stop() []statement {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	return r.stmts
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	if r.on {
		r.stmts = append(r.stmts, statement{sql: d.SQL, args: d.Args})
	}
	r.mu.Unlock()
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *recorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	r.batches++
	r.mu.Unlock()
	return ctx
}

func (r *recorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	if r.on {
		r.stmts = append(r.stmts, statement{sql: d.SQL, args: d.Args, batch: r.batches})
	}
	r.mu.Unlock()
}

func (r *recorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// pgbenchScript is a script and the -D definitions of its constants.
type pgbenchScript struct {
	text    string
	defines []string
}

// with is the script with more -D definitions (initial values of its variables).
func (s pgbenchScript) with(defines ...string) pgbenchScript {
	s.defines = append(slices.Clone(s.defines), defines...)
	return s
}

var placeholder = regexp.MustCompile(`\$(\d+)`)

// buildScript turns recorded statements into a pgbench script. vary maps argument values that
// must be fresh in every transaction to variable names set by prelude (a `SELECT … \gset`);
// every other argument is a constant passed with -D (NULLs and empty strings are written in
// place: pgbench variables cannot be either).
func buildScript(stmts []statement, vary map[string]string, prelude string) (pgbenchScript, error) {
	var b strings.Builder
	var out pgbenchScript
	consts := map[string]string{} // text value → variable name
	if prelude != "" {
		b.WriteString(prelude + "\n")
	}
	inPipeline := 0
	for _, st := range stmts {
		if st.batch != inPipeline {
			if inPipeline != 0 {
				b.WriteString("\\endpipeline\n")
			}
			if st.batch != 0 {
				b.WriteString("\\startpipeline\n")
			}
			inPipeline = st.batch
		}
		var failed error
		sql := placeholder.ReplaceAllStringFunc(st.sql, func(m string) string {
			n, _ := strconv.Atoi(m[1:])
			if n < 1 || n > len(st.args) {
				failed = fmt.Errorf("statement %q refers to %s of %d arguments", st.sql, m, len(st.args))
				return m
			}
			text, null, err := argText(st.args[n-1])
			if err != nil {
				failed = fmt.Errorf("statement %q, %s: %w", oneLine(st.sql), m, err)
				return m
			}
			if null {
				return "NULL"
			}
			if text == "" {
				return "''" // pgbench -D refuses an empty value
			}
			if v, ok := vary[text]; ok {
				return ":" + v
			}
			name, ok := consts[text]
			if !ok {
				name = fmt.Sprintf("c%d", len(consts)+1)
				consts[text] = name
				out.defines = append(out.defines, name+"="+text)
			}
			return ":" + name
		})
		if failed != nil {
			return pgbenchScript{}, failed
		}
		// One simple-protocol query of several statements (BEGIN …; SET LOCAL …) is several
		// commands in prepared mode.
		for _, part := range strings.Split(sql, ";") {
			if part = oneLine(part); part != "" {
				b.WriteString(part + ";\n")
			}
		}
	}
	if inPipeline != 0 {
		b.WriteString("\\endpipeline\n")
	}
	out.text = b.String()
	return out, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// argText is an argument as the text pgbench will send for it.
func argText(a any) (text string, null bool, err error) {
	switch v := a.(type) {
	case nil:
		return "", true, nil
	case string:
		return v, false, nil
	case int:
		return strconv.Itoa(v), false, nil
	case int32:
		return strconv.FormatInt(int64(v), 10), false, nil
	case int64:
		return strconv.FormatInt(v, 10), false, nil
	case bool:
		return strconv.FormatBool(v), false, nil
	case time.Time:
		return v.Format(time.RFC3339Nano), false, nil
	case *time.Time:
		if v == nil {
			return "", true, nil
		}
		return v.Format(time.RFC3339Nano), false, nil
	case []byte:
		return `\x` + hex.EncodeToString(v), false, nil
	case []string:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
		}
		return "{" + strings.Join(q, ",") + "}", false, nil
	}
	return "", false, fmt.Errorf("argument of type %T: teach argText its text form", a)
}

// pgbenchResult is one pgbench run: the transactions per second it reports (without connection
// time), how many it ran, and the CPU its own process used (seconds, from its rusage).
type pgbenchResult struct {
	tps  float64
	txns int
	cpu  float64
}

// runPgbench runs script with clients clients for d on the database at url.
func runPgbench(ctx context.Context, env *Env, url string, script pgbenchScript, clients int, d time.Duration) (pgbenchResult, error) {
	bin, err := pgbenchPath()
	if err != nil {
		return pgbenchResult{}, err
	}
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return pgbenchResult{}, err
	}
	dir, err := os.MkdirTemp("", "pitlane-pgbench-")
	if err != nil {
		return pgbenchResult{}, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "script.sql")
	if err := os.WriteFile(path, []byte(script.text), 0o644); err != nil {
		return pgbenchResult{}, err
	}
	args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(clients),
		"-T", strconv.Itoa(max(1, int(d.Round(time.Second).Seconds()))), "-f", path,
		"-h", cfg.Host, "-p", strconv.Itoa(int(cfg.Port)), "-U", cfg.User}
	for _, def := range script.defines {
		args = append(args, "-D", def)
	}
	args = append(args, cfg.Database)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+cfg.Password, "PGSSLMODE=disable")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return pgbenchResult{}, fmt.Errorf("pgbench: %w\n%s\nscript:\n%s", err, out.String(), script.text)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindStringSubmatch(out.String())
	if m == nil {
		return pgbenchResult{}, fmt.Errorf("pgbench: no tps in its output:\n%s", out.String())
	}
	if f := regexp.MustCompile(`number of failed transactions: ([1-9][0-9]*)`).FindStringSubmatch(out.String()); f != nil {
		return pgbenchResult{}, fmt.Errorf("pgbench: %s transactions failed:\n%s\nscript:\n%s", f[1], out.String(), script.text)
	}
	res := pgbenchResult{cpu: (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()}
	if res.tps, err = strconv.ParseFloat(m[1], 64); err != nil {
		return pgbenchResult{}, err
	}
	if n := regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`).FindStringSubmatch(out.String()); n != nil {
		res.txns, _ = strconv.Atoi(n[1])
	}
	return res, nil
}
