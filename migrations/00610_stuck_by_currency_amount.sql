-- +goose NO TRANSACTION
-- +goose Up
-- The workbench's "amount, largest first" compared minor units across currencies (¥3,000 is
-- 3000, €10.00 is 1000), so with no currency filter a yen payment sorted above a larger euro
-- one. It now sorts by currency, then amount largest first (payments/finance_workbench.go,
-- StuckByAmount): this index serves that order, and its keyset (a row comparison over
-- currency, -amount, id: one direction for all three keys), as one range — and, with a currency
-- filter, as a range of one currency instead of a walk of every amount filtered by currency.
-- It replaces payment_sessions_stuck_by_amount (00310): two indexes over the active sessions
-- would cost every Create and state change a second write. An old binary during the roll still
-- runs its amount order, sorted from the active sessions (a small part of the table).
--
-- CONCURRENTLY, outside a transaction, like 00510: payment_sessions takes writes on every
-- Create. Dropped first, so a build that failed half-way (INVALID) is built anew by running
-- `pitlane migrate` again.
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_stuck_by_currency_amount;
CREATE INDEX CONCURRENTLY payment_sessions_stuck_by_currency_amount ON payment_sessions (currency, (-amount), id)
    WHERE status IN ('Registering', 'Registered', 'Unknown', 'Authorized', 'Canceling');
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_stuck_by_amount;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS payment_sessions_stuck_by_amount ON payment_sessions (amount, id)
    WHERE status IN ('Registering', 'Registered', 'Unknown', 'Authorized', 'Canceling');
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_stuck_by_currency_amount;
