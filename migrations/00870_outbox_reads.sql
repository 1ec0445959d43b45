-- +goose NO TRANSACTION
-- +goose Up
-- Two reads of the outbox that read all of it (an outside review; the outbox keeps every message):
-- - the stats' count and age of failing messages (payments/stats.go, each /metrics refresh):
--   outbox_undelivered (00002) is the whole table when no NOTIFY_WEBHOOK_URL is set (nothing is
--   ever delivered), so both were sequential scans, 1 s at 2,000,000 messages. This index holds
--   only the messages whose delivery failed and is not over.
-- - the admin outbox of one payment (/outbox?payment=): payment_id had no index.
-- CONCURRENTLY, outside a transaction, like 00610: the outbox takes a write with every code.
DROP INDEX CONCURRENTLY IF EXISTS outbox_failing;
CREATE INDEX CONCURRENTLY outbox_failing ON outbox (created_at)
    WHERE delivered_at IS NULL AND skipped_at IS NULL AND attempts > 0;
DROP INDEX CONCURRENTLY IF EXISTS outbox_payment;
CREATE INDEX CONCURRENTLY outbox_payment ON outbox (payment_id, id) WHERE payment_id IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_payment;
DROP INDEX CONCURRENTLY IF EXISTS outbox_failing;
