-- +goose NO TRANSACTION
-- +goose Up
-- One index on the gateway's payment id instead of two (issue 10's drain, issue 12's figures).
--
-- payment_sessions had a unique index on (gateway, gateway_payment_id) — no gateway payment is
-- ours twice — and, for the console's search box, a plain one on (gateway_payment_id): the search
-- matches a gateway id without knowing the gateway, which an index led by gateway cannot answer.
-- Every session's transition that sets or carries the id wrote an entry in both. One unique index
-- led by the id does both jobs: it answers the search (id = $1) and the look-ups by gateway and id
-- (webhooks, Check), and keeps the same uniqueness, since the two column orders describe the same
-- pairs.
--
-- CONCURRENTLY, outside a transaction, as in 00351: the table is the busiest one. A build that
-- fails half-way is dropped first on the next `pitlane migrate`, and the old indexes are dropped
-- only after the new one exists, so uniqueness is enforced throughout.
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_gateway_payment_key;
CREATE UNIQUE INDEX CONCURRENTLY payment_sessions_gateway_payment_key ON payment_sessions (gateway_payment_id, gateway)
    WHERE gateway_payment_id IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_gateway_payment_id;
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_gateway_payment;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS payment_sessions_gateway_payment ON payment_sessions (gateway_payment_id)
    WHERE gateway_payment_id IS NOT NULL;
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS payment_sessions_gateway_payment_id ON payment_sessions (gateway, gateway_payment_id)
    WHERE gateway_payment_id IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_gateway_payment_key;
