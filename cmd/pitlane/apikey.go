package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"pitlane/payments"
)

// runApikey: `pitlane apikey create NAME | revoke ID|PREFIX | list`. create prints the new key
// alone on stdout (so `KEY=$(pitlane apikey create shop)` works) and what identifies it on
// stderr; the key is shown this once: only its SHA-256 is stored.
func runApikey(ctx context.Context, env *Env, args []string) error {
	const usage = "usage: pitlane apikey create NAME | revoke ID|PREFIX | list"
	if len(args) == 0 {
		return Usagef(usage)
	}
	sub, rest := args[0], args[1:]
	switch {
	case sub == "create" && len(rest) >= 1:
	case sub == "revoke" && len(rest) == 1:
	case sub == "list" && len(rest) == 0:
	default:
		return Usagef(usage)
	}
	svc, closeDB, err := adminService(ctx, env, "apikey")
	if err != nil {
		return err
	}
	defer closeDB()

	switch sub {
	case "create":
		name := strings.Join(rest, " ")
		c, key, err := svc.CreateAPIClient(ctx, name)
		if err != nil {
			return fmt.Errorf("create API client: %w", err)
		}
		fmt.Fprintln(env.Stdout, key)
		fmt.Fprintf(env.Stderr, "apikey: created client %q id %s prefix %s; the key above is shown only now\n", c.Name, c.ID, c.KeyPrefix)
	case "revoke":
		c, err := svc.RevokeAPIClient(ctx, rest[0])
		if err != nil {
			if payments.ErrorCode(err) == payments.EINVALID {
				return Usagef("%s", payments.ErrorMessage(err))
			}
			return fmt.Errorf("revoke API client: %w", err)
		}
		fmt.Fprintf(env.Stdout, "apikey: revoked client %q id %s prefix %s at %s\n", c.Name, c.ID, c.KeyPrefix, c.RevokedAt.UTC().Format(time.RFC3339))
	case "list":
		cs, err := svc.ListAPIClients(ctx)
		if err != nil {
			return err
		}
		for _, c := range cs {
			state := "active"
			if c.Revoked() {
				state = "revoked " + c.RevokedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(env.Stdout, "%s\t%s\t%s\t%s\t%s\n", c.ID, c.KeyPrefix, c.CreatedAt.UTC().Format(time.RFC3339), state, c.Name)
		}
	}
	return nil
}
