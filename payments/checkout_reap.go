package payments

import (
	"context"
	"fmt"
	"time"
)

// CheckoutIntentRetention: a Pay click older than this will not be retried by its browser.
const CheckoutIntentRetention = 30 * 24 * time.Hour

// ReapCheckoutIntents deletes, in one bounded batch, checkout intents (Pay clicks) older than
// CheckoutIntentRetention. It needs no lock and may run on every replica; the patrol runs it.
// (Console sessions are reaped by web/auth, sign-in throttle rows by package access.)
func (s *Service) ReapCheckoutIntents(ctx context.Context) (int64, error) {
	tag, err := s.db.Exec(ctx, `DELETE FROM checkout_intents WHERE key IN (SELECT key FROM checkout_intents
		WHERE created_at < $1 LIMIT 1000)`, s.cfg.Clock.Now().Add(-CheckoutIntentRetention))
	if err != nil {
		return 0, fmt.Errorf("reap checkout intents: %w", err)
	}
	return tag.RowsAffected(), nil
}
