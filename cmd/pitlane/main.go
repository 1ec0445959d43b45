// Command pitlane is the one binary of the service: see `pitlane help` and the README.
//
// This package only wires: configuration → database pool → services → web server. Each
// subcommand lives in its own file; adding one is a line in the commands table below plus
// that file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"pitlane/internal/config"
	"pitlane/payments"
)

// command is one subcommand. run gets a context canceled by SIGINT/SIGTERM and the
// arguments after the command name.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *Env, args []string) error
}

// commands is the dispatch table.
var commands = []command{
	{"migrate", "apply the embedded migrations to DATABASE_URL; exits 0 when the schema is current", runMigrate},
	{"serve", "web console, JSON API, webhook receiver and sweeper (needs DATABASE_URL)", runServe},
	{"dev", "[--dir .pitlane] [--demo]: private PostgreSQL in --dir (when DATABASE_URL is unset), migrations, demo data, then serve (--demo: seed a DATABASE_URL that has other staff users too)", runDev},
	{"apikey", "create NAME | rotate ID|PREFIX | revoke ID|PREFIX | list: API clients and their keys (create and rotate print a key once)", runApikey},
	{"gatewaysim", "the reference-gateway simulator on its own (--addr 127.0.0.1:8090; faults through its /_sim/ control API)", runGatewaysim},
	{"user", "create --email E --role support|finance|admin | disable E | enable E | role E ROLE | password E: console users (passwords on stdin)", runUser},
	{"reconcile", "[--since 24h]: compare recent sessions with the gateway now, under the patrol's lease (exit 75: another replica runs)", runReconcile},
	{"prune", "[--gateway-calls AGE] [--webhook-events 30d] [--outbox 90d] [--dry-run]: delete old rows of the tables that grow with traffic (AGE: 400d, 72h or keep)", runPrune},
}

// Env is what a command may touch of the outside world; tests substitute all of it.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	Logger *slog.Logger
}

// Config loads the configuration from the environment.
func (e *Env) Config() (config.Config, error) { return config.Load(e.Getenv) }

// UsageError is a wrong invocation: printed as one line, exit code 2 (like a bad setting).
type UsageError struct{ Msg string }

func (u *UsageError) Error() string { return u.Msg }

// ExitError is a failure with an exit status of its own, which its command documents (e.g.
// reconcile's ExitLeaseHeld); printed as one line like every error.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Usagef builds a UsageError.
func Usagef(format string, args ...any) error { return &UsageError{Msg: fmt.Sprintf(format, args...)} }

// parseFlags parses a command's flags. -h prints the usage line and the flags on stdout and ends
// the command with exit 0 (flag.ErrHelp), as every command's -h does; a bad flag is a usage
// error naming it.
func parseFlags(env *Env, fs *flag.FlagSet, usage string, args []string) error {
	fs.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) { f.Value = &onceValue{Value: f.Value} })
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(env.Stdout, usage)
		fs.SetOutput(env.Stdout)
		fs.PrintDefaults()
		return flag.ErrHelp
	}
	if err != nil {
		return Usagef("%s: %v (%s)", fs.Name(), err, usage)
	}
	return nil
}

// onceValue refuses a flag given twice: Go's flag package keeps the last, and `user create
// --role admin --role support` made a support user without a word (an outside review), as
// apikey's --scopes already refuses.
type onceValue struct {
	flag.Value
	set bool
}

// String is the flag's value; flag.PrintDefaults also calls it on a zero onceValue (no Value) to
// learn the zero default, and a panic there filled every command's -h with "panic calling
// String method" lines, one per flag, its defaults lost (an outside review, cli).
func (v *onceValue) String() string {
	if v == nil || v.Value == nil {
		return ""
	}
	return v.Value.String()
}

func (v *onceValue) Set(s string) error {
	if v.set {
		return errors.New("given twice")
	}
	v.set = true
	return v.Value.Set(s)
}

// IsBoolFlag keeps a boolean flag's bare form (--demo).
func (v *onceValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func main() {
	// A write to a closed pipe (`pitlane apikey create shop | reader`, the reader gone) is an
	// error the command handles — an API key nobody was shown is revoked (unshownKey) — not a
	// death by SIGPIPE before the write returns, which left that key active in nobody's hands
	// (an outside review, cli).
	signal.Ignore(syscall.SIGPIPE)
	env := &Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	env.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	os.Exit(Main(os.Args[1:], env))
}

// Main runs one command and returns the process exit code: 0 success, 2 bad usage or
// configuration (one line on stderr), 1 any other failure, or an ExitError's own code.
func Main(args []string, env *Env) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(env.Stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(env.Stderr, "pitlane: unknown command %q (see `pitlane help`)\n", args[0])
		return 2
	}
	if len(args) > 1 && isHelp(args[1]) && cmd.name != "gatewaysim" { // gatewaysim lists its own flags
		fmt.Fprintf(env.Stdout, "usage: pitlane %s %s\n\nConfiguration comes from the environment (DATABASE_URL, HTTP_ADDR, …); see README.md.\n", cmd.name, cmd.summary)
		return 0
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal, restore the default action: a second Ctrl-C kills at once
		// (and the private PostgreSQL still stops, through its parent-death signal).
		<-ctx.Done()
		stop()
	}()

	err := cmd.run(ctx, env, args[1:])
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(env.Stderr, "pitlane %s: %s\n", cmd.name, oneLine(err.Error()))
	var xerr *ExitError
	if errors.As(err, &xerr) {
		return xerr.Code
	}
	var cerr *config.Error
	var uerr *UsageError
	if errors.As(err, &cerr) || errors.As(err, &uerr) {
		return 2
	}
	return 1
}

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: pitlane <command> [arguments]")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Configuration comes from the environment (DATABASE_URL, HTTP_ADDR, …); see README.md.")
}

// oneLine keeps the promise of one line on stderr even for errors that wrap multi-line text:
// the lines are joined, not cut, because the cause is often on the last one (pgx's connect
// error names the user and database first and the refused host and port after a line break).
// What does not show as itself (payments.Escape: control and format characters, such as U+202E
// RIGHT-TO-LEFT OVERRIDE, which turns the rest of the line around) is written as escapes: the
// text may be a gateway's (reconcile's findings, an error quoting its answer), and an ESC or BEL
// from it reached the operator's terminal, which ran it — a cleared screen, a forged "all good"
// line (an outside review, cli).
func oneLine(s string) string {
	return payments.Escape(strings.Join(strings.Fields(s), " "), nil, func(r rune) string {
		if r < 0x100 {
			return fmt.Sprintf("\\x%02x", r)
		}
		return fmt.Sprintf("\\u%04x", r)
	})
}
