package payments

import (
	"context"
	"time"
)

// CheckoutIntentRetention: a Pay click older than this will not be retried by its browser.
const CheckoutIntentRetention = 30 * 24 * time.Hour

// ReapCheckoutIntents deletes checkout intents (Pay clicks) older than CheckoutIntentRetention,
// in batches of DefaultReapBatch until none is left (SKIP LOCKED: two replicas reaping at once
// take different rows). It needs no lock and may run on every replica; the patrol's housekeeping
// runs it. One batch per pass (every HousekeepingEvery) reaped at most 288,000 a day per
// replica, and a shop busier than that kept its old intents for good (an outside review); the
// index on created_at (migration 00640) keeps each batch from reading the whole table.
// (Console sessions are reaped by web/auth, sign-in throttle rows by package access.)
func (s *Service) ReapCheckoutIntents(ctx context.Context) (int64, error) {
	n, err := s.execBatches(ctx, "reap checkout intents", DefaultReapBatch, `DELETE FROM checkout_intents WHERE key IN (
		SELECT key FROM checkout_intents WHERE created_at < $1 ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)`,
		s.cfg.Clock.Now().Add(-CheckoutIntentRetention))
	return int64(n), err
}
