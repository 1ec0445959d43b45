package access_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"pitlane/access"
	"pitlane/internal/testdb"
	"pitlane/payments"
)

func TestMain(m *testing.M) {
	// Hashing in tests need not be slow: each hash carries its cost, so verification is the same
	// code path. The timing test sets a real cost on its own service.
	access.DefaultPasswordCost = bcrypt.MinCost
	os.Exit(m.Run())
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// cli is who the tests' user changes are recorded as.
var cli = payments.Staff{Email: "cli:test"}

type bench struct {
	pool  *pgxpool.Pool
	clock *payments.ManualClock
	acc   *access.Service
}

// newBench gives a test its own migrated database, a manual clock and an access service.
func newBench(t testing.TB) *bench {
	t.Helper()
	pool := testdb.New(t)
	clock := payments.NewManualClock(t0)
	return &bench{pool: pool, clock: clock, acc: access.New(pool, clock)}
}

func (b *bench) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", sql, err)
	}
	return n
}

const testPassword = "correct horse battery"

func (b *bench) user(t testing.TB, email string, role access.Role) access.User {
	t.Helper()
	u, err := b.acc.CreateUser(context.Background(), cli, email, role, testPassword)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
