package migrations

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// lockRetryable: the lock held by another migrate, a lost connection, a deadlock, a shutdown or a
// full connection table are looked at again; a database that refuses the write for good (read
// only, no privilege) or that needs someone (a disk full, a corrupted page) ends the migrate,
// and a code too short to read panics nobody.
func TestLockRetryableSortsTheDatabasesRefusals(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"08006": true, "40P01": true, "40001": true, "57P01": true, "57P03": true, "57014": true,
		"53300": true, "55P03": true, "55006": true,
		"25006": false, "42501": false, "42P01": false, "28P01": false, "3D000": false,
		"53100": false, "XX001": false, "58030": false, "": false, "X": false,
	} {
		err := fmt.Errorf("acquire lock: %w", &pgconn.PgError{Code: code})
		if got := lockRetryable(err); got != want {
			t.Errorf("SQLSTATE %q: retryable %v, want %v", code, got, want)
		}
	}
	if !lockRetryable(errors.New("failed to acquire lock: already held")) {
		t.Error("the lock held by another migrate is not looked at again")
	}
}
