package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"pitlane/access"
	"pitlane/payments"
)

// runApikey: `pitlane apikey create NAME [--scopes S,…] | revoke ID|PREFIX | list`. create
// prints the new key alone on stdout (so `KEY=$(pitlane apikey create shop)` works) and what
// identifies it on stderr; the key is shown this once: only its SHA-256 is stored. Without
// --scopes a key has all of them (payments:read, payments:write, refunds:write).
func runApikey(ctx context.Context, env *Env, args []string) error {
	const usage = "usage: pitlane apikey create NAME [--scopes payments:read,payments:write,refunds:write] | revoke ID|PREFIX | list"
	if len(args) == 0 {
		return Usagef(usage)
	}
	sub, rest := args[0], args[1:]
	var scopes []access.Scope
	switch {
	case sub == "create":
		var name []string
		var scopeList string
		for i := 0; i < len(rest); i++ {
			switch arg := rest[i]; {
			case arg == "--scopes" || arg == "-scopes":
				if i+1 == len(rest) {
					return Usagef(usage)
				}
				i++
				scopeList = rest[i]
			case strings.HasPrefix(arg, "--scopes=") || strings.HasPrefix(arg, "-scopes="):
				_, scopeList, _ = strings.Cut(arg, "=")
			default:
				name = append(name, arg)
			}
		}
		if len(name) == 0 {
			return Usagef(usage)
		}
		var err error
		if scopes, err = access.ParseScopes(scopeList); err != nil {
			return Usagef("apikey create: %s", payments.ErrorMessage(err))
		}
		rest = name
	case sub == "revoke" && len(rest) == 1:
	case sub == "list" && len(rest) == 0:
	default:
		return Usagef(usage)
	}
	acc, closeDB, err := openAccess(ctx, env, "apikey")
	if err != nil {
		return err
	}
	defer closeDB()

	switch sub {
	case "create":
		c, key, err := acc.CreateAPIClient(ctx, strings.Join(rest, " "), scopes...)
		if err != nil {
			return fmt.Errorf("create API client: %w", err)
		}
		fmt.Fprintln(env.Stdout, key)
		fmt.Fprintf(env.Stderr, "apikey: created client %q id %s prefix %s scopes %s; the key above is shown only now\n",
			c.Name, c.ID, c.KeyPrefix, access.JoinScopes(c.Scopes))
	case "revoke":
		c, err := acc.RevokeAPIClient(ctx, rest[0])
		if err != nil {
			if payments.ErrorCode(err) == payments.EINVALID {
				return Usagef("%s", payments.ErrorMessage(err))
			}
			return fmt.Errorf("revoke API client: %w", err)
		}
		fmt.Fprintf(env.Stdout, "apikey: revoked client %q id %s prefix %s at %s\n", c.Name, c.ID, c.KeyPrefix, c.RevokedAt.UTC().Format(time.RFC3339))
	case "list":
		cs, err := acc.ListAPIClients(ctx)
		if err != nil {
			return err
		}
		for _, c := range cs {
			state := "active"
			if c.Revoked() {
				state = "revoked " + c.RevokedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(env.Stdout, "%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.KeyPrefix, c.CreatedAt.UTC().Format(time.RFC3339), state,
				access.JoinScopes(c.Scopes), c.Name)
		}
	}
	return nil
}
