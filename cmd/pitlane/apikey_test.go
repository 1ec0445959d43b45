package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
)

func apikeyMain(env map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	e := &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string { return env[k] }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	code = Main(args, e)
	return code, out.String(), errOut.String()
}

func TestApikeyCreateListRevoke(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	env := map[string]string{"DATABASE_URL": url}

	code, out, stderr := apikeyMain(env, "apikey", "create", "shop", "backend")
	key := strings.TrimSpace(out)
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.HasPrefix(key, "pl_") || !strings.Contains(stderr, "shown only now") {
		t.Fatalf("create: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	svc := access.New(testdb.Pool(t, url), nil)
	c, err := svc.AuthenticateAPIKey(context.Background(), key)
	if err != nil || c.Name != "shop backend" || access.JoinScopes(c.Scopes) != "payments:read,payments:write,refunds:write" {
		t.Fatalf("the printed key: %+v %v", c, err)
	}

	// A key with fewer scopes (--scopes before or after the name).
	code, out, stderr = apikeyMain(env, "apikey", "create", "--scopes", "refunds:write,payments:read", "refunder")
	readOnly := strings.TrimSpace(out)
	if code != 0 || !strings.Contains(stderr, "scopes payments:read,refunds:write") {
		t.Fatalf("create --scopes: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if r, err := svc.AuthenticateAPIKey(context.Background(), readOnly); err != nil || r.Allows(access.ScopePaymentsWrite) ||
		!r.Allows(access.ScopeRefundsWrite) || !r.Allows(access.ScopePaymentsRead) {
		t.Fatalf("the scoped key: %+v %v", r, err)
	}

	code, out, _ = apikeyMain(env, "apikey", "list")
	if code != 0 || !strings.Contains(out, c.KeyPrefix) || !strings.Contains(out, "active") || strings.Contains(out, key) ||
		!strings.Contains(out, "\tpayments:read,payments:write,refunds:write\tshop backend\n") ||
		!strings.Contains(out, "\tpayments:read,refunds:write\trefunder\n") {
		t.Fatalf("list: exit %d %q", code, out)
	}
	// rotate: one more key of the same client, alone on stdout; the old one works until revoked.
	code, out, stderr = apikeyMain(env, "apikey", "rotate", c.ID)
	rotated := strings.TrimSpace(out)
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(stderr, "1 other key still works") {
		t.Fatalf("rotate: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if r, err := svc.AuthenticateAPIKey(context.Background(), rotated); err != nil || r.ID != c.ID {
		t.Fatalf("the rotated key: %+v %v", r, err)
	}
	if code, out, _ = apikeyMain(env, "apikey", "revoke", rotated[:15]); code != 0 || !strings.Contains(out, "revoked key "+rotated[:15]) ||
		!strings.Contains(out, "1 other key still works") {
		t.Fatalf("revoke the rotated key: exit %d %q", code, out)
	}
	code, out, stderr = apikeyMain(env, "apikey", "revoke", c.KeyPrefix)
	if code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("revoke: exit %d %q %q", code, out, stderr)
	}
	if _, err := svc.AuthenticateAPIKey(context.Background(), key); !errors.Is(err, access.ErrRevoked) {
		t.Fatalf("after revoke: %v", err)
	}
	// By id: the client and all its keys, and it says so (it named one of the keys' prefixes).
	r, err := svc.AuthenticateAPIKey(context.Background(), readOnly)
	if err != nil {
		t.Fatal(err)
	}
	if code, out, _ := apikeyMain(env, "apikey", "revoke", strings.ToUpper(r.ID)); code != 0 || !strings.Contains(out, "id "+r.ID+" and all its keys") {
		t.Fatalf("revoke by id: exit %d %q", code, out)
	}
	if code, _, stderr := apikeyMain(env, "apikey", "revoke", "pl_ffffffffffff"); code != 1 || !strings.Contains(stderr, "no API client") {
		t.Fatalf("revoke unknown: exit %d %q", code, stderr)
	}
	// Both changes are in the audit log, named after whoever ran the command, committed with
	// the change: a key that can refund money is never made or revoked unattributed.
	var n int
	if err := testdb.Pool(t, url).QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE actor = $1 AND target = $2
		AND ((action = $3 AND detail LIKE '%shop backend%payments:read,payments:write,refunds:write') OR (action = $4 AND detail LIKE '%shop backend%'))`,
		cliActor().Email, c.KeyPrefix, payments.AuditAPIKeyCreate, payments.AuditAPIKeyRevoke).Scan(&n); err != nil || n != 2 {
		t.Fatalf("audit entries of the key's creation and revocation: %d %v, want 2", n, err)
	}

	for _, args := range [][]string{{"apikey"}, {"apikey", "create"}, {"apikey", "revoke"}, {"apikey", "rotate"}, {"apikey", "rename", "x"},
		{"apikey", "create", "x", "--scopes"}, {"apikey", "create", "--scopes", "payments:read"}} {
		if code, _, stderr := apikeyMain(env, args...); code != 2 || !strings.Contains(stderr, "usage: pitlane apikey") {
			t.Errorf("%v: exit %d %q, want 2 and the usage", args, code, stderr)
		}
	}
	if code, _, stderr := apikeyMain(env, "apikey", "create", "x", "--scopes", "payments:delete"); code != 2 || !strings.Contains(stderr, "unknown scope") {
		t.Errorf("create with an unknown scope: exit %d %q", code, stderr)
	}
	// A misspelled flag, an empty or repeated --scopes, a bad name: usage (exit 2), no key. Before,
	// `--scope payments:read` became part of the name and the key got every scope.
	_, before, _ := apikeyMain(env, "apikey", "list")
	for _, args := range [][]string{
		{"apikey", "create", "shopX", "--scope", "payments:read"},
		{"apikey", "create", "n", "--bogus"},
		{"apikey", "create", "n", "--scopes", ""},
		{"apikey", "create", "n", "--scopes=payments:read", "--scopes=refunds:write"},
		{"apikey", "create", "bad\nname\x1b[31m"},
		{"apikey", "create", strings.Repeat("n", 201)},
	} {
		if code, out, stderr := apikeyMain(env, args...); code != 2 || out != "" || stderr == "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2, no key and a reason", args, code, out, stderr)
		}
	}
	if _, after, _ := apikeyMain(env, "apikey", "list"); after != before {
		t.Errorf("refused creates made clients:\n%s\nwas\n%s", after, before)
	}
	// A name may start with a dash after --.
	if code, _, stderr := apikeyMain(env, "apikey", "create", "--", "-dash-shop"); code != 0 || !strings.Contains(stderr, `"-dash-shop"`) {
		t.Errorf("create -- -dash-shop: exit %d %q", code, stderr)
	}
	if code, _, stderr := apikeyMain(env, "apikey", "revoke", "nonsense"); code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("revoke nonsense: exit %d %q", code, stderr)
	}
	if code, _, stderr := apikeyMain(map[string]string{}, "apikey", "create", "x"); code != 2 || !strings.Contains(stderr, "DATABASE_URL") {
		t.Errorf("no database: exit %d %q", code, stderr)
	}
}

// failingWriter is a stdout that takes nothing (a full disk, a closed descriptor).
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// A new key that could not be written to stdout is revoked and the command fails: only its hash
// is stored, so nobody could ever hold it. Before, create and rotate said "the key above is
// shown only now", exit 0, and left an active key in no one's hands.
func TestApikeyKeyThatCannotBeWrittenIsRevoked(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	env := map[string]string{"DATABASE_URL": url}
	run := func(args ...string) (int, string) {
		var errOut bytes.Buffer
		e := &Env{Stdin: strings.NewReader(""), Stdout: failingWriter{}, Stderr: &errOut,
			Getenv: func(k string) string { return env[k] }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		return Main(args, e), errOut.String()
	}
	pool := testdb.Pool(t, url)
	live := func() int {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM api_client_keys k JOIN api_clients c ON c.id = k.client_id
			WHERE k.revoked_at IS NULL AND c.revoked_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if code, stderr := run("apikey", "create", "full-disk"); code == 0 || !strings.Contains(stderr, "revoked") || strings.Contains(stderr, "shown only now") {
		t.Fatalf("create to a stdout that fails: exit %d, stderr %q", code, stderr)
	}
	if n := live(); n != 0 {
		t.Fatalf("%d live keys after a create whose key was never shown", n)
	}
	code, out, _ := apikeyMain(env, "apikey", "create", "shop")
	if code != 0 {
		t.Fatalf("create: %d", code)
	}
	prefix := strings.TrimSpace(out)[:len("pl_")+12]
	if code, stderr := run("apikey", "rotate", prefix); code == 0 || !strings.Contains(stderr, "revoked") {
		t.Fatalf("rotate to a stdout that fails: exit %d, stderr %q", code, stderr)
	}
	if n := live(); n != 1 {
		t.Fatalf("%d live keys after a rotate whose key was never shown, want the one shown before", n)
	}
	if _, err := access.New(pool, nil).AuthenticateAPIKey(context.Background(), strings.TrimSpace(out)); err != nil {
		t.Fatalf("the key shown before no longer works: %v", err)
	}
}
