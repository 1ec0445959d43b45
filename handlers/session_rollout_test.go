package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alexedwards/scs/v2"

	"pitlane/access"
	"pitlane/web/auth"
)

// During the rolling deploy to hashed session keys, a session signed in on a replica of the
// release before lives under its clear token. Its first request to a new replica stored a copy
// under the token's hash (hashedStore.CommitCtx) and left the clear row; a sign-out on an old
// replica (pgxstore: the clear row only) left the copy, and a copy of the old cookie kept opening
// the console on the new replicas. The session is now saved where it is. An outside review
// (replicas); negative control: the copy, the dashboard still 200 after the sign-out.
func TestASignOutOnAnOldReplicaEndsTheSessionOnNewOnes(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	b.user(t, "ana@example.com", access.RoleSupport)
	ctx := context.Background()
	u, err := b.access.User(ctx, "ana@example.com")
	if err != nil {
		t.Fatal(err)
	}
	// What the release before stored at sign-in: the clear token, scs's gob data (no idle stamp:
	// that release had no idle timeout).
	old := strings.Repeat("o", 43)
	data, err := scs.GobCodec{}.Encode(time.Now().Add(auth.SessionLifetime),
		map[string]any{"email": u.Email, "epoch": u.SessionEpoch, "csrf": strings.Repeat("c", 43)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO sessions (token, data, expiry) VALUES ($1, $2, $3)`, old, data, time.Now().Add(auth.SessionLifetime)); err != nil {
		t.Fatal(err)
	}
	status := func() int {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.AddCookie(&http.Cookie{Name: auth.SessionCookie, Value: old})
		rec := httptest.NewRecorder()
		b.e.ServeHTTP(rec, r)
		return rec.Code
	}
	if got := status(); got != http.StatusOK {
		t.Fatalf("the old release's session on a new replica: %d, want 200", got)
	}
	if n := b.count(t, `SELECT count(*) FROM sessions WHERE token = encode(sha256(convert_to($1, 'UTF8')), 'hex')`, old); n != 0 {
		t.Errorf("a request on a new replica copied the old release's session under its hash (%d rows)", n)
	}

	// Sign-out on an old replica: scs RenewToken -> pgxstore.Delete(token), its only statement.
	if _, err := b.pool.Exec(ctx, `DELETE FROM sessions WHERE token = $1`, old); err != nil {
		t.Fatal(err)
	}
	if got := status(); got == http.StatusOK {
		t.Fatalf("signed out on an old replica, the old cookie still opens the dashboard on a new replica (%d): the hashed copy survived", got)
	}
}
