package payments_test

import (
	"context"
	"strings"
	"testing"

	"pitlane/internal/config"
	"pitlane/payments"
)

// TestSecretKeyRotation: SECRET_KEY rotates without breaking what is in customers' hands. Replicas
// are rolled in three steps (docs/operations.md): the new secret added as a fallback everywhere,
// then made current with the old one as the fallback, then — after the longest link lifetime —
// the old one dropped. A checkout link and a one-time code made on either side of a step verify
// on the other side; without the fallback (the negative controls) they do not.
func TestSecretKeyRotation(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	oldKey, newKey := []byte(strings.Repeat("o", 32)), []byte(strings.Repeat("n", 32))
	with := func(replica string, current []byte, fallbacks ...[]byte) *payments.Service {
		return b.service(b.pool, replica, func(c *payments.Config) {
			c.CodeSecret, c.CodeSecretFallbacks = current, fallbacks
		})
	}
	before := with("before", oldKey)        // every replica before the rotation
	step1 := with("step-1", oldKey, newKey) // the new secret verifies, the old one signs
	step2 := with("step-2", newKey, oldKey) // the new secret signs, the old one verifies
	afterward := with("after", newKey)      // the old secret gone
	verify := func(on *payments.Service, l payments.CheckoutLink) error {
		return on.VerifyCheckoutLink(l.OrderID, l.Amount, l.Currency, l.ExpiresAt.Unix(), l.Generation, l.Sig, l.GenSig)
	}
	link := func(by *payments.Service, order string) payments.CheckoutLink {
		t.Helper()
		l, err := by.CheckoutLink(ctx, order, 1999, "EUR", 0)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// A link signed before the rotation works on a replica at step 2 (and at step 1).
	old := link(before, "rot-1")
	if err := verify(step2, old); err != nil {
		t.Errorf("old link on a step-2 replica: %v", err)
	}
	if err := verify(step1, old); err != nil {
		t.Errorf("old link on a step-1 replica: %v", err)
	}
	// A link signed at step 2 works on a replica still at step 1 (the rollout is rolling).
	fresh := link(step2, "rot-2")
	if err := verify(step1, fresh); err != nil {
		t.Errorf("step-2 link on a step-1 replica: %v", err)
	}
	// Negative controls: without the fallback, neither works across the change.
	if err := verify(afterward, old); payments.ErrorCode(err) != payments.EINVALID {
		t.Errorf("old link after the old secret was dropped = %v, want EINVALID", err)
	}
	if err := verify(before, fresh); payments.ErrorCode(err) != payments.EINVALID {
		t.Errorf("step-2 link on a replica that never heard of the new secret = %v, want EINVALID", err)
	}
	// A fallback verifies but never signs: step 1 still signs with the old secret.
	if err := verify(before, link(step1, "rot-3")); err != nil {
		t.Errorf("a step-1 link on a replica before the rotation: %v (step 1 must sign with the old secret)", err)
	}

	// A one-time code sent by a replica on the old secret is accepted by one at step 2.
	sess := b.registered(t, "rot-code", 500)
	ch, err := before.RequestCancel(ctx, api, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	code := b.lastCode(t, sess.ID)
	if _, err := afterward.ConfirmCancel(ctx, api, sess.ID, ch.ID, code); payments.ErrorCode(err) != payments.EWRONG {
		t.Fatalf("code under the old secret on a replica without it = %v, want EWRONG (negative control)", err)
	}
	res, err := step2.ConfirmCancel(ctx, api, sess.ID, ch.ID, code)
	if err != nil || res.Session.Status != payments.StatusCanceled {
		t.Fatalf("code under the old secret on a step-2 replica = %+v %v, want canceled", res, err)
	}
}

// A SECRET_KEY with spaces around it (a trailing newline: a Kubernetes secret made from a file)
// signed with them, while the same value moved into SECRET_KEY_FALLBACKS at a rotation's second
// step was trimmed there: every link signed under the old key failed on the new replicas (an
// outside review). The key now signs trimmed, as fallbacks are read, and the value as given
// still verifies, as SECRET_KEY and as a fallback (what the release before signed with it, for
// weeks). Negative controls: the key kept as given fails the second step; without the
// as-given fallbacks the release before's link fails with the same key and at the second step.
func TestSecretKeyRotationWithSpacesAroundTheKey(t *testing.T) {
	t.Parallel()
	old := strings.Repeat("o", 32) + "\n"
	load := func(vars map[string]string) config.Config {
		t.Helper()
		c, err := config.Load(func(k string) string { return vars[k] })
		if err != nil {
			t.Fatalf("config.Load(%q): %v", vars, err)
		}
		return c
	}
	b := newBench(t)
	with := func(replica string, secret []byte, fallbacks [][]byte) *payments.Service {
		return b.service(b.pool, replica, func(pc *payments.Config) { pc.CodeSecret, pc.CodeSecretFallbacks = secret, fallbacks })
	}
	before := load(map[string]string{"SECRET_KEY": old})
	step2 := load(map[string]string{"SECRET_KEY": strings.Repeat("n", 32), "SECRET_KEY_FALLBACKS": old})
	for _, signer := range []struct {
		name   string
		secret []byte
	}{{"this release", before.SecretKey}, {"the release before (the key as given)", []byte(old)}} {
		l, err := with("signer", signer.secret, nil).CheckoutLink(context.Background(), "rot-nl", 1999, "EUR", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, verifier := range []struct {
			name string
			c    config.Config
		}{{"the same SECRET_KEY", before}, {"the rotation's second step", step2}} {
			if err := with("verifier", verifier.c.SecretKey, verifier.c.SecretKeyFallbacks).VerifyCheckoutLink(l.OrderID, l.Amount, l.Currency, l.ExpiresAt.Unix(), l.Generation, l.Sig, l.GenSig); err != nil {
				t.Errorf("a link signed by %s fails on a replica with %s: %v", signer.name, verifier.name, err)
			}
		}
	}
}
