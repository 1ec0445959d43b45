package main

import (
	"context"
	"fmt"
)

// runMigrate: `pitlane migrate` applies the embedded migrations to DATABASE_URL. Safe from
// several replicas at the same moment; a no-op (exit 0) when the schema is current.
func runMigrate(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 {
		return Usagef("migrate takes no arguments")
	}
	cfg, err := env.Config()
	if err != nil {
		return err
	}
	if err := cfg.RequireDatabase("migrate"); err != nil {
		return err
	}
	n, err := migrate(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "migrate: applied %d migration(s); the schema is current\n", n)
	return nil
}
