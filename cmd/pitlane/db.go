package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // "pgx" database/sql driver for goose

	"pitlane/access"
	"pitlane/migrations"
	"pitlane/payments"
)

// openPool opens the application's pool. It does not wait for the database (pgxpool connects
// lazily), so a replica that starts before its database is reachable comes up unready (/readyz)
// instead of crash-looping.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// migrate applies pending migrations over database/sql (goose's interface). Concurrent runs are
// serialised by goose's table lock (see package migrations).
func migrate(ctx context.Context, url string) (int, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return 0, fmt.Errorf("database: %w", err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return 0, fmt.Errorf("connect to database: %w", err)
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
	if err := cfg.RequireDatabase(command); err != nil {
		return nil, nil, err
	}
	pool, err := openPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, nil, err
	}
	return access.New(pool, databaseClock(ctx, pool, env.Logger)), pool.Close, nil
}

// clockSyncEvery is how often a server reads the database's clock again (besides at once when
// its host's wall and monotonic clocks part): a step of the database's own clock (NTP, a
// failover to a standby) reaches every replica within it.
const clockSyncEvery = 10 * time.Second

// clockSyncWait bounds the first measurement.
const clockSyncWait = 5 * time.Second

// databaseClock is the clock of the commands that write or compare times the servers read
// (reconcile, user, apikey): the database's, read on this host (payments.DatabaseClock), once
// now. A failure (or no answer within clockSyncWait) leaves the host's clock in use and says so
// (the command's own statements fail the same way then). serve reads it with Run instead. A host clock more than a second off is logged: pitlane
// follows the database, but the host's logs and anything else on it do not.
func databaseClock(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) *payments.DatabaseClock {
	clock := payments.NewDatabaseClock(nil)
	sctx, cancel := context.WithTimeout(ctx, clockSyncWait)
	defer cancel()
	off, within, err := clock.Sync(sctx, pool)
	switch {
	case err != nil:
		logger.Warn("clock: could not read the database's clock; using this host's until the next try", "err", err)
	case off > time.Second || off < -time.Second:
		logger.Warn("clock: this host's clock is off the database's; pitlane's times follow the database's",
			"host_offset", off, "within", within)
	}
	return clock
}
