package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // "pgx" database/sql driver for goose

	"pitlane/access"
	"pitlane/migrations"
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
	return access.New(pool, nil), pool.Close, nil
}
