package payments_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"pitlane/payments"
)

func TestAPIClientKeys(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	c, key, err := b.svc.CreateAPIClient(ctx, "  shop backend ")
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
	got, err := b.svc.AuthenticateAPIKey(ctx, key)
	if err != nil || got.ID != c.ID {
		t.Fatalf("authenticate = %+v %v", got, err)
	}
	wrong := key[:len(key)-1] + map[bool]string{true: "0", false: "1"}[key[len(key)-1] != '0']
	for _, k := range []string{wrong, "", "pl_", "Bearer " + key, key + "x", strings.ToUpper(key), "pl_000000000000_" + strings.Repeat("0", 64)} {
		if _, err := b.svc.AuthenticateAPIKey(ctx, k); !errors.Is(err, payments.ErrUnauthenticated) {
			t.Errorf("key %q: %v, want unauthenticated", k, err)
		}
	}
	if _, _, err := b.svc.CreateAPIClient(ctx, " "); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("empty name = %v", err)
	}

	b.clock.Advance(time.Second)
	other, otherKey, err := b.svc.CreateAPIClient(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.svc.RevokeAPIClient(ctx, c.KeyPrefix)
	if err != nil || !r.Revoked() {
		t.Fatalf("revoke by prefix = %+v %v", r, err)
	}
	if _, err := b.svc.AuthenticateAPIKey(ctx, key); !errors.Is(err, payments.ErrRevoked) {
		t.Fatalf("revoked key = %v", err)
	}
	if _, err := b.svc.AuthenticateAPIKey(ctx, otherKey); err != nil {
		t.Fatalf("the other client's key must still work: %v", err)
	}
	again, err := b.svc.RevokeAPIClient(ctx, c.ID)
	if err != nil || !again.RevokedAt.Equal(*r.RevokedAt) {
		t.Fatalf("revoke twice = %+v %v", again, err)
	}
	if _, err := b.svc.RevokeAPIClient(ctx, "pl_ffffffffffff"); payments.ErrorCode(err) != payments.ENOTFOUND {
		t.Fatalf("unknown prefix = %v", err)
	}
	if _, err := b.svc.RevokeAPIClient(ctx, "nonsense"); payments.ErrorCode(err) != payments.EINVALID {
		t.Fatalf("nonsense = %v", err)
	}
	list, err := b.svc.ListAPIClients(ctx)
	if err != nil || len(list) != 2 || list[0].ID != c.ID || list[1].ID != other.ID {
		t.Fatalf("list = %+v %v", list, err)
	}
}
