package access_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"pitlane/access"
	"pitlane/payments"
)

func TestAPIClientKeys(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	c, key, err := b.acc.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "  shop backend ")
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "shop backend" || !strings.HasPrefix(key, c.KeyPrefix+"_") || len(key) != len(c.KeyPrefix)+1+64 {
		t.Fatalf("client %+v key %q", c, key)
	}
	// Only the hash is stored: the key appears nowhere in the table.
	if n := b.count(t, `SELECT count(*) FROM api_clients WHERE position($1 in concat_ws(' ', id::text, name, key_prefix, encode(key_hash, 'escape'))) > 0`, key); n != 0 {
		t.Fatal("the key is stored in clear")
	}
	got, err := b.acc.AuthenticateAPIKey(ctx, key)
	if err != nil || got.ID != c.ID {
		t.Fatalf("authenticate = %+v %v", got, err)
	}
	wrong := key[:len(key)-1] + map[bool]string{true: "0", false: "1"}[key[len(key)-1] != '0']
	for _, k := range []string{wrong, "", "pl_", "Bearer " + key, key + "x", strings.ToUpper(key), "pl_000000000000_" + strings.Repeat("0", 64)} {
		if _, err := b.acc.AuthenticateAPIKey(ctx, k); !errors.Is(err, access.ErrUnauthenticated) {
			t.Errorf("key %q: %v, want unauthenticated", k, err)
		}
	}
	if _, _, err := b.acc.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, " "); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("empty name = %v", err)
	}

	b.clock.Advance(time.Second)
	other, otherKey, err := b.acc.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "other")
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.acc.RevokeAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, c.KeyPrefix)
	if err != nil || !r.Revoked() {
		t.Fatalf("revoke by prefix = %+v %v", r, err)
	}
	if _, err := b.acc.AuthenticateAPIKey(ctx, key); !errors.Is(err, access.ErrRevoked) {
		t.Fatalf("revoked key = %v", err)
	}
	if _, err := b.acc.AuthenticateAPIKey(ctx, otherKey); err != nil {
		t.Fatalf("the other client's key must still work: %v", err)
	}
	again, err := b.acc.RevokeAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, c.ID)
	if err != nil || !again.RevokedAt.Equal(*r.RevokedAt) {
		t.Fatalf("revoke twice = %+v %v", again, err)
	}
	if _, err := b.acc.RevokeAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "pl_ffffffffffff"); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("unknown prefix = %v", err)
	}
	if _, err := b.acc.RevokeAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "nonsense"); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("nonsense = %v", err)
	}
	list, err := b.acc.ListAPIClients(ctx)
	if err != nil || len(list) != 2 || list[0].ID != c.ID || list[1].ID != other.ID {
		t.Fatalf("list = %+v %v", list, err)
	}
}

// TestAPIClientScopes: a key has the scopes it was made with (all three when none are named),
// and Authorize is EFORBIDDEN outside them.
func TestAPIClientScopes(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	all, allKey, err := b.acc.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "all")
	if err != nil || access.JoinScopes(all.Scopes) != "payments:read,payments:write,refunds:write" {
		t.Fatalf("default scopes: %+v %v", all, err)
	}
	ro, roKey, err := b.acc.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "reader", access.ScopePaymentsRead)
	if err != nil || access.JoinScopes(ro.Scopes) != "payments:read" {
		t.Fatalf("read-only: %+v %v", ro, err)
	}
	for key, want := range map[string]map[access.Scope]bool{
		allKey: {access.ScopePaymentsRead: true, access.ScopePaymentsWrite: true, access.ScopeRefundsWrite: true},
		roKey:  {access.ScopePaymentsRead: true},
	} {
		c, err := b.acc.AuthenticateAPIKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, sc := range access.Scopes {
			err := c.Authorize(sc)
			if want[sc] != (err == nil) || (err != nil && payments.ErrorCode(err) != payments.EFORBIDDEN) {
				t.Errorf("%s: Authorize(%s) = %v", c.Name, sc, err)
			}
		}
	}
	for in, want := range map[string]string{
		"": "payments:read,payments:write,refunds:write",
		" refunds:write , payments:read,refunds:write": "payments:read,refunds:write",
	} {
		got, err := access.ParseScopes(in)
		if err != nil || access.JoinScopes(got) != want {
			t.Errorf("ParseScopes(%q) = %v %v, want %s", in, got, err, want)
		}
	}
	if _, err := access.ParseScopes("payments:read,admin"); payments.ErrorCode(err) != payments.EINVALID {
		t.Errorf("unknown scope: %v", err)
	}
	if _, _, err := b.acc.CreateAPIClient(ctx, payments.Staff{Email: "test@example.com", Role: "admin"}, "bad", "payments:delete"); payments.ErrorCode(err) != payments.EINVALID {
		t.Errorf("create with an unknown scope: %v", err)
	}
	// The table refuses what the code would refuse too.
	if _, err := b.pool.Exec(ctx, `UPDATE api_clients SET scopes = '{admin}' WHERE id = $1`, ro.ID); err == nil {
		t.Error("the database accepted an unknown scope")
	}
}

// A rotated key is the same client: both keys authenticate as it with its scopes until each is
// revoked by its prefix; revoking the first key alone leaves the new one working (and its hash in
// api_clients unusable, for a replica of the release before); a client with no key that works is
// revoked and gets no new key. A first key written the way the release before wrote it (straight
// into api_clients, during a rolling deploy) works here too.
func TestAPIKeyRotation(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	admin := payments.Staff{Email: "test@example.com", Role: "admin"}
	c, oldKey, err := b.acc.CreateAPIClient(ctx, admin, "shop", access.ScopePaymentsRead, access.ScopeRefundsWrite)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Second)
	r, newKey, err := b.acc.RotateAPIKey(ctx, admin, c.KeyPrefix)
	if err != nil || r.ID != c.ID || r.KeyPrefix == c.KeyPrefix || !strings.HasPrefix(newKey, r.KeyPrefix+"_") || r.LiveKeys != 2 {
		t.Fatalf("rotate = %+v %q %v", r, newKey, err)
	}
	for _, k := range []string{oldKey, newKey} {
		got, err := b.acc.AuthenticateAPIKey(ctx, k)
		if err != nil || got.ID != c.ID || access.JoinScopes(got.Scopes) != "payments:read,refunds:write" {
			t.Fatalf("key %s… = %+v %v, want the client with its scopes", k[:15], got, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM audit_log WHERE action = $1 AND target = $2 AND detail LIKE '%beside 1 that still work%'`,
		payments.AuditAPIKeyRotate, r.KeyPrefix); n != 1 {
		t.Fatalf("rotation audit entries = %d, want 1", n)
	}
	list, err := b.acc.ListAPIClients(ctx)
	if err != nil || len(list) != 2 || list[0].KeyPrefix != c.KeyPrefix || list[1].KeyPrefix != r.KeyPrefix || list[1].ID != c.ID {
		t.Fatalf("list = %+v %v, want both keys of the client, the first first", list, err)
	}

	b.clock.Advance(time.Second)
	gone, err := b.acc.RevokeAPIClient(ctx, admin, c.KeyPrefix)
	if err != nil || !gone.Revoked() || gone.LiveKeys != 1 {
		t.Fatalf("revoke the first key = %+v %v", gone, err)
	}
	if _, err := b.acc.AuthenticateAPIKey(ctx, oldKey); !errors.Is(err, access.ErrRevoked) {
		t.Fatalf("the revoked first key = %v", err)
	}
	if got, err := b.acc.AuthenticateAPIKey(ctx, newKey); err != nil || got.Revoked() {
		t.Fatalf("the new key after the old one was revoked = %+v %v", got, err)
	}
	// What a replica of the release before asks: the first key's hash in api_clients.
	if n := b.count(t, `SELECT count(*) FROM api_clients WHERE key_prefix = $1 AND (key_hash = sha256(convert_to($2, 'UTF8')) OR revoked_at IS NOT NULL)`,
		c.KeyPrefix, oldKey); n != 0 {
		t.Fatal("a replica of the release before would still take the revoked first key")
	}

	b.clock.Advance(time.Second)
	last, err := b.acc.RevokeAPIClient(ctx, admin, r.KeyPrefix)
	if err != nil || last.LiveKeys != 0 {
		t.Fatalf("revoke the last key = %+v %v", last, err)
	}
	if n := b.count(t, `SELECT count(*) FROM api_clients WHERE id = $1 AND revoked_at IS NOT NULL`, c.ID); n != 1 {
		t.Fatal("a client with no key that works is not revoked")
	}
	if _, _, err := b.acc.RotateAPIKey(ctx, admin, c.ID); payments.ErrorCode(err) != payments.ECONFLICT {
		t.Fatalf("rotate a revoked client = %v, want conflict", err)
	}
	for _, name := range []string{"pl_ffffffffffff", payments.RefundIntentOwner} {
		if _, _, err := b.acc.RotateAPIKey(ctx, admin, name); payments.ErrorCode(err) != payments.ENOTFOUND {
			t.Fatalf("rotate %s = %v, want not found", name, err)
		}
	}
	if _, _, err := b.acc.RotateAPIKey(ctx, admin, "nonsense"); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("rotate nonsense = %v, want invalid", err)
	}

	// The release before's insert: the trigger files the key among the client's keys.
	const legacyKey = "pl_0123456789ab_" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if _, err := b.pool.Exec(ctx, `INSERT INTO api_clients (id, name, key_prefix, key_hash, scopes, created_at)
		VALUES (gen_random_uuid(), 'old release', 'pl_0123456789ab', sha256(convert_to($1, 'UTF8')), '{payments:read}', now())`, legacyKey); err != nil {
		t.Fatal(err)
	}
	if got, err := b.acc.AuthenticateAPIKey(ctx, legacyKey); err != nil || got.Name != "old release" {
		t.Fatalf("a key the release before made = %+v %v", got, err)
	}
}
