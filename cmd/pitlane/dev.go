package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"pitlane/internal/config"
	"pitlane/internal/pgrunner"
	"pitlane/payments"
)

// devDatabase is the database `dev` creates in its private cluster.
const devDatabase = "pitlane"

// runDev: `pitlane dev`, the newcomer's one command. With DATABASE_URL unset it runs a private
// PostgreSQL whose data lives in .pitlane/pg (so demo data survives a restart), applies the
// migrations, seeds demo orders and demo staff logins (whose passwords it prints) and serves.
// Ctrl-C stops the server, then the database.
//
// With DATABASE_URL set, the database may be shared (a team's staging database): dev seeds
// demo data there only while it has no staff user but dev's own demo ones, no API client and
// no order but dev's (a new database, as
// the contract's "demo orders and demo staff logins printed on start" has it), never demo
// accounts with printed passwords beside real people's, unless --demo says to; its banner says
// which it did.
func runDev(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	dir := fs.String("dir", ".pitlane", "where dev keeps its PostgreSQL data, log and secret")
	demo := fs.Bool("demo", false, "with DATABASE_URL: seed demo users and orders into that database too")
	if err := parseFlags(env, fs, "usage: pitlane dev [--dir .pitlane] [--demo]", args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return Usagef("dev takes no positional arguments")
	}
	cfg, err := env.Config()
	if err != nil {
		return err
	}
	if cfg.MerchantName == "" {
		cfg.MerchantName = config.DevMerchantName // a demo: its checkout says so
	}
	if len(cfg.SecretKey) == 0 {
		if cfg.SecretKey, err = config.LoadOrCreateSecret(filepath.Join(*dir, "secret")); err != nil {
			return err
		}
	}

	dbNote := "DATABASE_URL" // a configured URL may hold a password: not printed
	private := cfg.DatabaseURL == ""
	if private {
		fmt.Fprintf(env.Stderr, "dev: starting a private PostgreSQL in %s\n", filepath.Join(*dir, "pg"))
		cluster, err := pgrunner.Start(ctx, pgrunner.Dev(filepath.Join(*dir, "pg")))
		if err != nil {
			return err
		}
		defer func() {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintln(env.Stderr, "dev:", err)
			}
		}()
		if cfg.DatabaseURL, err = cluster.EnsureDatabase(ctx, devDatabase); err != nil {
			return err
		}
		dbNote = fmt.Sprintf("%s (private; data in %s, log %s)", cfg.DatabaseURL, cluster.DataDir(), cluster.LogPath())

		// If the database dies under us, stop serving instead of answering 503s forever.
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		go func() {
			select {
			case <-cluster.Done():
				cancel(errors.New("the private PostgreSQL exited; see " + cluster.LogPath()))
			case <-ctx.Done():
			}
		}()
	}

	n, err := migrate(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// The gateway: the in-process simulator (and its demo orders) unless GATEWAY/GATEWAY_URL
	// name another one.
	seed := private || *demo
	if !seed {
		if seed, err = onlyDemoStaff(ctx, pool); err != nil {
			return err
		}
	}
	d := &devStart{logger: env.Logger, withSim: usesDevSimulator(cfg), seed: seed,
		simState: filepath.Join(*dir, "gatewaysim.json"), cli: devCLI(cfg.DatabaseURL, private)}
	return serveWith(ctx, cfg, pool, env.Logger, serveOptions{
		prepare: d.prepare,
		started: d.started,
		ready:   func(url string) { d.printReady(ctx, env.Stdout, url, dbNote, n) },
	})
}

// devCLI is how the banner's commands start: this binary, with the private database's URL in
// front (its port changes with every start; the commands that need a database say so, and a
// newcomer following the docs had no URL to give them: an outside review of the examples).
// A configured DATABASE_URL may hold a password: it is not printed, the caller has it set.
func devCLI(dbURL string, private bool) string {
	exe, err := os.Executable()
	if err != nil {
		exe = "pitlane"
	}
	if !private {
		return shellQuote(exe)
	}
	return "DATABASE_URL=" + shellQuote(dbURL) + " " + shellQuote(exe)
}

// shellQuote is s as one word for sh: in single quotes; a quote inside ends them, is escaped
// and opens them again.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// onlyDemoStaff says whether the database has no staff user but dev's demo ones, no API client
// and no order but dev's: a new database (or one dev seeded before), where seeding the demo
// hurts no one. A database that serves a shop over the API alone (no staff user yet) is not
// one: dev pointed at it made an admin with the printed demo password there (an outside review).
func onlyDemoStaff(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	emails := make([]string, len(demoStaff))
	for i, u := range demoStaff {
		emails[i] = u.email
	}
	var others bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM staff_users WHERE email <> ALL($1))
		OR EXISTS (SELECT 1 FROM api_clients WHERE id <> $2)
		OR EXISTS (SELECT 1 FROM orders WHERE order_id !~ '^demo-[0-9]+$')`, emails, payments.RefundIntentOwner).Scan(&others); err != nil {
		return false, fmt.Errorf("dev: read staff users, API clients and orders: %w", err)
	}
	return !others, nil
}
