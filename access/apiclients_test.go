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
