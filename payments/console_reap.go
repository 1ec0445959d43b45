package payments

import (
	"context"
	"fmt"
	"time"
)

// Retention of what the console and the checkout leave behind.
const (
	// CheckoutIntentRetention: a Pay click older than this will not be retried by its browser.
	CheckoutIntentRetention = 30 * 24 * time.Hour
	// LoginThrottleRetention: failures this old, with no lock in force, count for nothing.
	LoginThrottleRetention = 24 * time.Hour
)

// ReapConsole deletes, in bounded batches, expired console sessions (pgxstore's own cleanup
// goroutine is off), stale sign-in throttle rows and old checkout intents. It needs no lock and
// may run on every replica; SignIn calls it on the way, so nothing has to schedule it.
func (s *Service) ReapConsole(ctx context.Context) (int64, error) {
	now := s.cfg.Clock.Now()
	var total int64
	for _, q := range []struct {
		what string
		sql  string
		args []any
	}{
		// pgxstore compares expiry with the database's clock, so this does too.
		{"sessions", `DELETE FROM sessions WHERE token IN (SELECT token FROM sessions WHERE expiry < now() LIMIT 1000)`, nil},
		{"login throttle", `DELETE FROM staff_login_throttle WHERE email IN (SELECT email FROM staff_login_throttle
			WHERE last_failure_at < $1 AND (locked_until IS NULL OR locked_until < $2) LIMIT 1000)`,
			[]any{now.Add(-LoginThrottleRetention), now}},
		{"checkout intents", `DELETE FROM checkout_intents WHERE key IN (SELECT key FROM checkout_intents
			WHERE created_at < $1 LIMIT 1000)`, []any{now.Add(-CheckoutIntentRetention)}},
	} {
		tag, err := s.db.Exec(ctx, q.sql, q.args...)
		if err != nil {
			return total, fmt.Errorf("reap %s: %w", q.what, err)
		}
		total += tag.RowsAffected()
	}
	return total, nil
}
