-- +goose NO TRANSACTION
-- +goose Up
-- The housekeeping's reaper of checkout intents (payments/checkout_reap.go) deletes those past
-- 30 days in batches until none is left; its "oldest first, created_at < cutoff" read had only
-- (order_id, created_at), so every batch read the table. CONCURRENTLY, outside a transaction,
-- like 00571: checkout_intents takes an insert on every Pay click.
DROP INDEX CONCURRENTLY IF EXISTS checkout_intents_created;
CREATE INDEX CONCURRENTLY checkout_intents_created ON checkout_intents (created_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS checkout_intents_created;
