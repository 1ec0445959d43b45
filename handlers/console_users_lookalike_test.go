package handlers_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"pitlane/access"
)

// TestALookalikeRowIsItself: a row stored before emails were composed ("jose" and a combining
// accent, as a release before 06ab981 stored it, or as the normal form that was not stable
// stored "MARİ́A@…") beside the composed josé@example.com, an admin. Every look-up of it
// normalized its email again and landed on josé: the Users page disabled josé when an admin
// disabled the old row, set josé's password when the old row's owner asked for a reset (and
// that owner then signed in as the admin), and the old row's session was served as josé (an
// outside review). Its stored email is itself. Negative control: changeUser and User looking up
// NormalizeEmail(email) alone.
func TestALookalikeRowIsItself(t *testing.T) {
	t.Parallel()
	b := newConsoleBench(t)
	ctx := context.Background()
	const composed, decomposed = "jos\u00e9@example.com", "jose\u0301@example.com"
	b.user(t, "root@example.com", access.RoleAdmin)
	b.user(t, composed, access.RoleAdmin)
	var oldID string
	if err := b.pool.QueryRow(ctx, `INSERT INTO staff_users (email, role, password_hash, created_at)
		SELECT $1, 'support', password_hash, created_at FROM staff_users WHERE email = 'root@example.com'
		RETURNING id::text`, decomposed).Scan(&oldID); err != nil {
		t.Fatal(err)
	}
	if u, err := b.access.User(ctx, decomposed); err != nil || u.Role != access.RoleSupport {
		t.Fatalf("User(the old row's email) = %+v, %v: want the old row (a support user)", u, err)
	}

	adm := b.agent(t)
	adm.login("root@example.com")
	adm.get("/admin/users")
	adm.follow(adm.post("/admin/users/"+oldID+"/password", url.Values{"password": {"a password for the old row"}}))
	joseAgent := b.agent(t)
	joseAgent.get("/login")
	if rec := joseAgent.post("/login", url.Values{"email": {composed}, "password": {testPassword}}); rec.Code != http.StatusSeeOther {
		t.Errorf("a new password for the old row took josé's: josé signs in with theirs = %d", rec.Code)
	}
	adm.get("/admin/users")
	adm.follow(adm.post("/admin/users/"+oldID+"/disable", nil))
	var joseDisabled, oldDisabled bool
	if err := b.pool.QueryRow(ctx, `SELECT
			(SELECT disabled_at IS NOT NULL FROM staff_users WHERE email = $1),
			(SELECT disabled_at IS NOT NULL FROM staff_users WHERE id = $2::bigint)`, composed, oldID).Scan(&joseDisabled, &oldDisabled); err != nil {
		t.Fatal(err)
	}
	if joseDisabled || !oldDisabled {
		t.Fatalf("disable on the old row: it disabled=%v; josé disabled=%v", oldDisabled, joseDisabled)
	}
}
