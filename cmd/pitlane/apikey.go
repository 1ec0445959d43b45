package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"pitlane/access"
	"pitlane/payments"
)

// runApikey: `pitlane apikey create NAME [--scopes S,…] | rotate ID|PREFIX | revoke ID|PREFIX |
// list`. create and rotate print the new key alone on stdout (so `KEY=$(pitlane apikey create
// shop)` works) and what identifies it on stderr; the key is shown this once: only its SHA-256
// is stored. Without --scopes a key has all of them (payments:read, payments:write,
// refunds:write). rotate gives the client one more key (same client, scopes and idempotency
// keys); revoke by a prefix ends that key, by the id the client and all its keys.
func runApikey(ctx context.Context, env *Env, args []string) error {
	const usage = "usage: pitlane apikey create NAME [--scopes payments:read,payments:write,refunds:write] | rotate ID|PREFIX | revoke ID|PREFIX | list"
	if len(args) == 0 {
		return Usagef(usage)
	}
	sub, rest := args[0], args[1:]
	var scopes []access.Scope
	switch {
	case sub == "create":
		// A misspelled flag must not become part of the name while the key silently gets every
		// scope (`--scope payments:read` asked for a read-only key): anything that looks like a
		// flag and is not --scopes is a usage error, and so are --scopes twice or empty.
		var name []string
		var scopeList string
		scopesGiven := false
		for i := 0; i < len(rest); i++ {
			arg := rest[i]
			var list string
			switch {
			case arg == "--scopes" || arg == "-scopes":
				if i+1 == len(rest) {
					return Usagef(usage)
				}
				i++
				list = rest[i]
			case strings.HasPrefix(arg, "--scopes=") || strings.HasPrefix(arg, "-scopes="):
				_, list, _ = strings.Cut(arg, "=")
			case arg == "--":
				name = append(name, rest[i+1:]...)
				i = len(rest)
				continue
			case strings.HasPrefix(arg, "-"):
				return Usagef("apikey create: unknown flag %q (the only flag is --scopes)\n%s", arg, usage)
			default:
				name = append(name, arg)
				continue
			}
			if scopesGiven {
				return Usagef("apikey create: --scopes given twice; list every scope once, comma-separated")
			}
			if strings.TrimSpace(list) == "" {
				return Usagef("apikey create: --scopes needs at least one scope (without --scopes a key has all of them)")
			}
			scopesGiven, scopeList = true, list
		}
		if len(name) == 0 {
			return Usagef(usage)
		}
		var err error
		if scopes, err = access.ParseScopes(scopeList); err != nil {
			return Usagef("apikey create: %s", payments.ErrorMessage(err))
		}
		rest = name
	case (sub == "revoke" || sub == "rotate") && len(rest) == 1:
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
		c, key, err := acc.CreateAPIClient(ctx, cliActor(), strings.Join(rest, " "), scopes...)
		if err != nil {
			if payments.ErrorCode(err) == payments.EINVALID {
				return Usagef("apikey create: %s", payments.ErrorMessage(err))
			}
			return fmt.Errorf("create API client: %w", err)
		}
		if _, err := fmt.Fprintln(env.Stdout, key); err != nil {
			return unshownKey(ctx, acc, c.KeyPrefix, err)
		}
		fmt.Fprintf(env.Stderr, "apikey: created client %q id %s prefix %s scopes %s; the key above is shown only now\n",
			c.Name, c.ID, c.KeyPrefix, access.JoinScopes(c.Scopes))
	case "rotate":
		c, key, err := acc.RotateAPIKey(ctx, cliActor(), rest[0])
		if err != nil {
			if payments.ErrorCode(err) == payments.EINVALID {
				return Usagef("%s", payments.ErrorMessage(err))
			}
			return fmt.Errorf("rotate API key: %w", err)
		}
		if _, err := fmt.Fprintln(env.Stdout, key); err != nil {
			return unshownKey(ctx, acc, c.KeyPrefix, err)
		}
		fmt.Fprintf(env.Stderr, "apikey: new key for client %q id %s prefix %s scopes %s; the key above is shown only now. "+
			"The client's %s: revoke each by its prefix (pitlane apikey revoke PREFIX) once the client uses this one\n",
			c.Name, c.ID, c.KeyPrefix, access.JoinScopes(c.Scopes), otherKeys(c.LiveKeys-1))
	case "revoke":
		c, err := acc.RevokeAPIClient(ctx, cliActor(), rest[0])
		if err != nil {
			if payments.ErrorCode(err) == payments.EINVALID {
				return Usagef("%s", payments.ErrorMessage(err))
			}
			return fmt.Errorf("revoke API client: %w", err)
		}
		if c.LiveKeys > 0 {
			fmt.Fprintf(env.Stdout, "apikey: revoked key %s of client %q id %s at %s; the client's %s\n",
				c.KeyPrefix, c.Name, c.ID, c.RevokedAt.UTC().Format(time.RFC3339), otherKeys(c.LiveKeys))
			break
		}
		if strings.EqualFold(rest[0], c.ID) { // by id (any case): the client and every key of it (KeyPrefix is one of them)
			fmt.Fprintf(env.Stdout, "apikey: revoked client %q id %s and all its keys at %s\n", c.Name, c.ID, c.RevokedAt.UTC().Format(time.RFC3339))
			break
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
			name := c.Name
			if !payments.PlainLine(name) {
				name = strconv.Quote(name) // a name from before names were checked: one line, no escapes
			}
			fmt.Fprintf(env.Stdout, "%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.KeyPrefix, c.CreatedAt.UTC().Format(time.RFC3339), state,
				access.JoinScopes(c.Scopes), name)
		}
	}
	return nil
}

// unshownKey revokes a new key that could not be written out (a full disk, a closed stdout):
// only its hash is stored, so nobody could ever hold it, and the command said it was shown (an
// outside review: exit 0, "the key above is shown only now", an active key in no one's hands).
// The command fails; run it again.
func unshownKey(ctx context.Context, acc *access.Service, prefix string, werr error) error {
	if _, err := acc.RevokeAPIClient(ctx, cliActor(), prefix); err != nil {
		return fmt.Errorf("write the key to stdout: %w; revoking the unshown key failed too (%v): revoke %s yourself", werr, err, prefix)
	}
	return fmt.Errorf("write the key to stdout: %w; the unshown key %s is revoked, run the command again", werr, prefix)
}

// otherKeys says how many other keys of a client still work, in words.
func otherKeys(n int) string {
	if n == 1 {
		return "1 other key still works"
	}
	return fmt.Sprintf("%d other keys still work", n)
}
