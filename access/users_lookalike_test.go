package access_test

import (
	"context"
	"strings"
	"testing"

	"pitlane/access"
	"pitlane/payments"
)

// EnsureUser (pitlane dev's demo logins) creates an account unless it exists: an email refused
// for looking like another account was taken for "exists", and dev's seeding then said the demo
// login was not found (a review). The look-alike refusal is an error of its own. Negative
// control: EnsureUser swallowing every conflict.
func TestEnsureUserReportsALookalike(t *testing.T) {
	t.Parallel()
	b := newBench(t)
	ctx := context.Background()
	// A row from before the look-alike rule, with a Cyrillic а: it reads as admin@pitlane.dev.
	if _, err := b.pool.Exec(ctx, `INSERT INTO staff_users (email, role, password_hash, created_at) VALUES ($1, 'support', 'x', now())`, "\u0430dmin@pitlane.dev"); err != nil {
		t.Fatal(err)
	}
	created, err := b.acc.EnsureUser(ctx, cli, "admin@pitlane.dev", access.RoleAdmin, testPassword)
	if created || payments.ErrorCode(err) != payments.ECONFLICT || !strings.Contains(err.Error(), "looks like the existing account") {
		t.Fatalf("EnsureUser beside a look-alike = %v, %v; want its refusal", created, err)
	}
	b.user(t, "ana@example.com", access.RoleSupport)
	if created, err := b.acc.EnsureUser(ctx, cli, "ana@example.com", access.RoleSupport, testPassword); created || err != nil {
		t.Fatalf("EnsureUser of an existing account = %v, %v; want not created, no error", created, err)
	}
}
