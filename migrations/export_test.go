package migrations

import "time"

// SetLockProbe sets how often a migrate waiting for the lock looks again, for a test; it returns
// the restore.
func SetLockProbe(d time.Duration) func() {
	old := lockProbe
	lockProbe = d
	return func() { lockProbe = old }
}
