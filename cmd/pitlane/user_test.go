package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"pitlane/internal/testdb"
)

func runMain(stdin string, env map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	e := &Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string { return env[k] }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	code = Main(args, e)
	return code, out.String(), errOut.String()
}

func TestUserCreate(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	env := map[string]string{"DATABASE_URL": url}
	const pw = "a long enough password"

	code, out, stderr := runMain(pw+"\n", env, "user", "create", "--email", "Ana@Example.com", "--role", "support")
	if code != 0 || !strings.Contains(out, "created ana@example.com (support)") {
		t.Fatalf("create: exit %d, out %q, err %q", code, out, stderr)
	}
	pool := testdb.Pool(t, url)
	var hash, role string
	if err := pool.QueryRow(context.Background(), `SELECT password_hash, role FROM staff_users WHERE email = 'ana@example.com'`).Scan(&hash, &role); err != nil {
		t.Fatal(err)
	}
	if role != "support" || !strings.HasPrefix(hash, "$2") || strings.Contains(hash, pw) {
		t.Fatalf("stored role %q hash %q", role, hash)
	}
	var audited int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE action = 'user.create' AND target = 'ana@example.com'`).Scan(&audited); err != nil || audited != 1 {
		t.Fatalf("audit rows %d %v", audited, err)
	}

	// Bad input: exit 2, one line, nothing created. Checked before the database is needed.
	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{pw, []string{"user", "create", "--email", "bo@example.com", "--role", "boss"}, "role must be one of"},
		{pw, []string{"user", "create", "--email", "not-an-email", "--role", "admin"}, "not a plain email"},
		{"short\n", []string{"user", "create", "--email", "bo@example.com", "--role", "admin"}, "at least 12 characters"},
		{"", []string{"user", "create", "--email", "bo@example.com", "--role", "admin"}, "no password on standard input"},
		{pw, []string{"user", "create", "--role", "admin"}, "usage: pitlane user create"},
		{pw, []string{"user", "delete"}, "usage: pitlane user create"},
	} {
		code, _, stderr := runMain(tc.stdin, map[string]string{}, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
	}
	// The email is taken: exit 1.
	code, _, stderr = runMain(pw+"\n", env, "user", "create", "--email", "ana@example.com", "--role", "admin")
	if code != 1 || !strings.Contains(stderr, "already exists") {
		t.Fatalf("duplicate: exit %d, %q", code, stderr)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM staff_users`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d users, want 1 (%v)", n, err)
	}
}
