-- +goose NO TRANSACTION
-- +goose Up
-- The console's payment search matches an order id by prefix (order_id LIKE 'q%',
-- payments/console.go ListPayments). PostgreSQL turns such a LIKE into an index range only on an
-- index whose ordering is byte order: under the C collation (the tests' clusters), or with
-- text_pattern_ops. A database created with any other locale (en_US.UTF-8, Debian's and most
-- clouds' default) read every payment ever made for each search (an outside review: a seq scan
-- of the whole table, linear in its age). This index replaces payment_sessions_order (00001) on
-- the same columns: text_pattern_ops serves the prefix range under any collation and the
-- equality look-ups of an order's sessions (by created_at) as before, so a Create still writes
-- one index entry for it, not two.
--
-- CONCURRENTLY, outside a transaction, like 00610: payment_sessions takes writes on every Create.
-- Dropped first, so a build that failed half-way (INVALID) is built anew by running
-- `pitlane migrate` again.
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_order_pattern;
CREATE INDEX CONCURRENTLY payment_sessions_order_pattern ON payment_sessions (order_id text_pattern_ops, created_at);
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_order;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS payment_sessions_order ON payment_sessions (order_id, created_at);
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_order_pattern;
