package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib" // also the "pgx" database/sql driver for goose

	"pitlane/access"
	"pitlane/internal/config"
	"pitlane/migrations"
	"pitlane/payments"
	"pitlane/payments/dbconn"
)

// openPool opens the application's pool. It does not wait for the database (pgxpool connects
// lazily), so a replica that starts before its database is reachable comes up unready (/readyz)
// instead of crash-looping.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	dbconn.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// migrate applies pending migrations over database/sql (goose's interface). Concurrent runs are
// serialised by goose's table lock (see package migrations).
func migrate(ctx context.Context, url string) (int, error) {
	// Parsed as the pool parses it: DATABASE_URL may carry the pool's own settings
	// (pool_max_conns, …), which a plain connection would send to PostgreSQL as run-time
	// parameters and have refused ("unrecognized configuration parameter").
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, fmt.Errorf("database: %w", err)
	}
	dbconn.Configure(&cfg.ConnConfig.Config) // a host that never answers is an error, not a hang
	db := stdlib.OpenDB(*cfg.ConnConfig)
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return 0, fmt.Errorf("connect to database at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return migrations.Up(ctx, db)
}

// openAccess is what the admin commands (apikey, user) work with: the configuration's database,
// required, and the access rules over it (no payment service: they touch no payment, and need no
// gateway). close gives the pool back.
func openAccess(ctx context.Context, env *Env, command string) (acc *access.Service, close func(), err error) {
	cfg, err := env.Config()
	if err != nil {
		return nil, nil, err
	}
	pool, clock, err := openMigrated(ctx, cfg, command)
	if err != nil {
		return nil, nil, err
	}
	return access.New(pool, clock), pool.Close, nil
}

// openMigrated opens the configuration's database, which command requires, with the
// database's clock (the time every row was written with), refusing one that lacks a migration.
// The caller closes the pool.
func openMigrated(ctx context.Context, cfg config.Config, command string) (*pgxpool.Pool, *payments.DatabaseClock, error) {
	if err := cfg.RequireDatabase(command); err != nil {
		return nil, nil, err
	}
	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, nil, err
	}
	clock, err := databaseClock(ctx, pool)
	if err == nil {
		err = requireMigrated(ctx, pool)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, clock, nil
}

// requireMigrated refuses a database that lacks some of the migrations this binary embeds: a
// command run before `pitlane migrate` says so, instead of PostgreSQL's words about a table that
// does not exist (or, for a newer binary on an older schema, a column).
func requireMigrated(ctx context.Context, pool *pgxpool.Pool) error {
	ok, err := migrated(ctx, pool)
	if err != nil {
		return fmt.Errorf("database: cannot tell whether it is migrated: %w", err)
	}
	if !ok {
		return errors.New("the database lacks migrations this binary needs: run `pitlane migrate` first")
	}
	return nil
}

// migratedBound bounds one migrations check: a connection whose host went silent (a failover
// that left the old host silent while new connections reach the new primary) held the patrol's
// start until TCP gave up — never, while that host's kernel still acknowledged — and the replica
// served, ready, without sweeping (a review of a silent host).
const migratedBound = 10 * time.Second

// migrated reports whether the database has every migration this binary embeds.
func migrated(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, migratedBound)
	defer cancel()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return migrations.Current(ctx, db)
}

// waitMigrated waits until the database has every migration this binary embeds (checked every
// second; the first wait is logged) and reports whether it does, false when ctx ended first.
func waitMigrated(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) bool {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for logged := false; ; {
		ok, err := migrated(ctx, pool)
		if ok {
			return true
		}
		if !logged && ctx.Err() == nil {
			if err != nil {
				logger.Warn("the patrol waits: the database does not answer whether it is migrated", "err", err)
			} else {
				logger.Warn("the patrol waits for the database's migrations (run `pitlane migrate`)")
			}
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// clockSyncEvery is how often a server reads the database's clock again (besides at once when
// its host's wall and monotonic clocks part): a step of the database's own clock (NTP, a
// failover to a standby) reaches every replica within it.
const clockSyncEvery = 10 * time.Second

// clockSyncWait bounds a command's reading of the database's clock.
const clockSyncWait = 5 * time.Second

// databaseClock is the clock of the commands that write or compare times the servers read
// (reconcile, user, apikey): the database's, read on this host (payments.DatabaseClock), once
// now. A command that cannot read it (within clockSyncWait) does not run on its host's clock:
// it fails, as its own statements would. serve reads it with Run instead.
func databaseClock(ctx context.Context, pool *pgxpool.Pool) (*payments.DatabaseClock, error) {
	clock := payments.NewDatabaseClock(nil)
	sctx, cancel := context.WithTimeout(ctx, clockSyncWait)
	defer cancel()
	if _, _, err := clock.Sync(sctx, pool); err != nil {
		return nil, err
	}
	return clock, nil
}
