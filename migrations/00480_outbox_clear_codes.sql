-- +goose NO TRANSACTION
-- +goose Up
-- The messages whose text still holds a code in clear (a delivered or skipped one keeps only its
-- redacted text). The housekeeping redacts those whose code is dead (consumed, superseded,
-- expired, out of attempts): without a notifier the outbox is the customer's channel and nothing
-- is ever delivered, so dead codes stayed in clear for good. The index holds the few live ones.
--
-- CONCURRENTLY, outside a transaction, as in 00351: the outbox keeps every message ever sent.
-- A build that fails half-way is dropped first on the next `pitlane migrate`.
DROP INDEX CONCURRENTLY IF EXISTS outbox_clear_codes;
CREATE INDEX CONCURRENTLY outbox_clear_codes ON outbox (id) WHERE redacted_body IS NOT NULL AND body <> redacted_body;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_clear_codes;
