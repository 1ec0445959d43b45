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
// (Console sessions are reaped by web/auth, sign-in throttle rows by package access.) An
// intent a click held within the last IdempotencyReapGrace (locked_until: the same old form
// submitted again took it back) is not reaped under it: its bind then found no row and the click
// that made and registered its payment was answered "no such payment attempt" (a review of late
// sends). Not only while the hold lasts: the click's Create and bind go on past it (RecordGrace,
// a bind written later), an hour is longer than any request's bound (a review of that fix).
func (s *Service) ReapCheckoutIntents(ctx context.Context) (int64, error) {
	now := s.cfg.Clock.Now()
	n, err := s.execBatches(ctx, "reap checkout intents", DefaultReapBatch, `DELETE FROM checkout_intents WHERE key IN (
		SELECT key FROM checkout_intents WHERE created_at < $1 AND (locked_until IS NULL OR locked_until <= $2)
		ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED)`,
		now.Add(-CheckoutIntentRetention), now.Add(-IdempotencyReapGrace))
	return int64(n), err
}
