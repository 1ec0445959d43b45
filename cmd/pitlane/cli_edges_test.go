package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"pitlane/internal/testdb"
)

// `pitlane apikey create shop | reader-that-already-exited`: the key cannot be written to stdout
// (a broken pipe), so unshownKey revokes it and fails the command: no active key is in no one's
// hands. In a real process a write to a broken pipe on fd 1 raised SIGPIPE, which Go's runtime
// turned into death by signal before Fprintln returned: unshownKey never ran and the key stayed
// active (an outside review, cli; main ignores SIGPIPE).
func TestApikeyCreateIntoABrokenPipeLeavesNoActiveKey(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool := testdb.Pool(t, url)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // the reader is gone before the key is written
	cmd := pitlane(map[string]string{"DATABASE_URL": url}, "apikey", "create", "shop")
	cmd.Stdout = w
	var stderr strings.Builder
	cmd.Stderr = &stderr
	runErr := cmd.Run()
	w.Close()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(stderr.String(), "is revoked") {
		t.Errorf("a create whose key could not be written: %v, exit %d, stderr %q; want exit 1 naming the revoked key", runErr, code, stderr.String())
	}
	var live int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM api_client_keys k JOIN api_clients c ON c.id = k.client_id
		WHERE k.revoked_at IS NULL AND c.revoked_at IS NULL`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if live != 0 {
		t.Fatalf("%d active API key(s) after a create whose key never reached anyone (process ended: %s); want it revoked, as unshownKey does", live, cmd.ProcessState)
	}
}

// What the gateway says reached `pitlane reconcile`'s stdout as it was: a gateway (or whatever
// answers at GATEWAY_URL: a proxy, a misrouted deploy) that put terminal control sequences in its
// error message got them run by the operator's terminal, as oneLine joined white space only (an
// outside review, cli); a right-to-left override turned the rest of the line around. `apikey list` quotes a name that is not a plain line for this reason.
func TestReconcilePrintsNoControlCharactersFromTheGateway(t *testing.T) {
	t.Parallel()
	b := newReconcileBench(t)
	b.create(t, "rc-esc")
	hostile := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":"boom","message":"\u001b]0;owned\u0007\u001b[2J\u001b[1;1Hreconcile refgw: all good, 0 errors \u202edeliaf"}`)
	}))
	defer hostile.Close()
	env := map[string]string{}
	for k, v := range b.env {
		env[k] = v
	}
	env["GATEWAY_URL"] = hostile.URL
	_, out, stderr := b.run(t, env, "--since", "1h")
	if strings.ContainsAny(out+stderr, "\x1b\x07\u202e") {
		t.Fatalf("reconcile printed the gateway's control characters (ESC, BEL, a right-to-left override) to the operator's terminal:\n%q", out)
	}
	// Escaped once, by the gateway's error text (payments.storable: <U+001B>) before the CLI's
	// own escaping (\x1b) sees it.
	if !strings.Contains(out, `<U+001B>]0;owned<U+0007>`) || !strings.Contains(out, `<U+202E>deliaf`) {
		t.Errorf("reconcile's finding does not show the gateway's message escaped:\n%s", out)
	}
}

// An email typed in a Latin-1 terminal (or read from a Latin-1 CSV by a script) is not UTF-8:
// "jos\xe9@example.com" is josé. `user create` refuses it (exit 2, like any address that is not
// one): NormalizeEmail made the byte U+FFFD and the command created "jos\ufffd@example.com",
// exit 0 — an account nobody's browser can name, and one that every other non-UTF-8 spelling
// (josè, jos\xff…) also names (an outside review, cli).
func TestUserCreateRefusesAnEmailThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	env := map[string]string{"DATABASE_URL": url}
	const pw = "a long enough password"
	code, _, _ := runMain(pw+"\n", env, "user", "create", "--email", "jos\xe9@example.com", "--role", "admin")
	var stored []string
	rows, err := testdb.Pool(t, url).Query(context.Background(), `SELECT email FROM staff_users`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, e)
	}
	if code != 2 || len(stored) != 0 {
		t.Fatalf("user create --email jos\\xe9@example.com: exit %d, users now %q; want exit 2 and no user", code, stored)
	}
}

// A command's -h lists its flags. parseFlags wraps every flag in onceValue; flag.PrintDefaults
// builds a zero onceValue (nil Value) to tell whether a default is worth showing, its String
// panicked, and the flag package printed the recovered panic into the help (an outside review):
// "panic calling String method on zero main.onceValue for flag email: runtime error: invalid
// memory address or nil pointer dereference", once per flag, on stdout (user create -h,
// prune --dry-run -h, reconcile --since 1h -h, dev --dir x -h). Defaults are lost too.
func TestCommandHelpCarriesNoPanic(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"user", "create", "-h"}, {"prune", "--dry-run", "-h"}, {"reconcile", "--since", "1h", "-h"}} {
		code, out, stderr := runMain("", map[string]string{}, args...)
		if code != 0 || strings.Contains(out, "panic") || strings.Contains(stderr, "panic") {
			t.Errorf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, out, stderr)
		}
	}
}

// Accounts a release before created under rules that came since — "jos\ufffd@example.com" from
// `user create --email jos\xe9@example.com` (exit 0, an enabled admin), or the zero-width-space
// look-alike "root@example.com\u200b" — stay reachable from the command line: userChange
// validated the typed email with ValidateEmail, the rule for new accounts, so the command line
// could no longer disable (offboard) them — nor re-role or re-password them, the same path, whichever way they were
// spelt (a review of TestUserCreateRefusesAnEmailThatIsNotUTF8's change). userChange checks the
// address's syntax only (access.CheckAddress).
func TestUserDisableReachesAccountsCreatedBeforeARule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		stored string
		typed  []string
	}{
		{"jos\ufffd@example.com", []string{"jos\xe9@example.com", "jos\ufffd@example.com"}},
		{"root@example.com\u200b", []string{"root@example.com\u200b"}},
	} {
		url := testdb.NewURL(t)
		env := map[string]string{"DATABASE_URL": url}
		if code, _, stderr := runMain("a long enough password\n", env, "user", "create", "--email", "root@example.com", "--role", "admin"); code != 0 {
			t.Fatalf("create root: %d %s", code, stderr)
		}
		pool := testdb.Pool(t, url)
		ctx := context.Background()
		// As the release before stored it.
		if _, err := pool.Exec(ctx, `INSERT INTO staff_users (email, role, password_hash, created_at)
			SELECT $1, 'admin', password_hash, created_at FROM staff_users WHERE email = 'root@example.com'`, tc.stored); err != nil {
			t.Fatal(err)
		}
		for _, typed := range tc.typed {
			code, out, stderr := runMain("", env, "user", "disable", typed)
			var disabled bool
			if err := pool.QueryRow(ctx, `SELECT disabled_at IS NOT NULL FROM staff_users WHERE email = $1`, tc.stored).Scan(&disabled); err != nil {
				t.Fatal(err)
			}
			if code != 0 || !disabled {
				t.Errorf("user disable %q (an account the release before created): exit %d, disabled %v\nstdout: %s\nstderr: %s", typed, code, disabled, out, stderr)
			}
		}
	}
}
