-- +goose NO TRANSACTION
-- +goose Up
-- The checkout's budget of new Pay clicks per order (payments/checkout_intent.go,
-- CheckoutStartsPerHour) counts an order's intents of the last hour on every new click; without
-- this index that count read the whole table (intents are kept 30 days).
--
-- CONCURRENTLY, outside a transaction, like 00510: checkout_intents takes an insert on every Pay
-- click, and a plain build would stop them for its length. Dropped first, so a build that failed
-- half-way (an INVALID index) is built anew by running `pitlane migrate` again.
DROP INDEX CONCURRENTLY IF EXISTS checkout_intents_order_created;
CREATE INDEX CONCURRENTLY checkout_intents_order_created ON checkout_intents (order_id, created_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS checkout_intents_order_created;
