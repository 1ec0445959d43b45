-- +goose NO TRANSACTION
-- +goose Up
-- The ledger page lists the newest 500 entries of a filter (payments.LedgerEntries, newest by
-- created_at): a range ending in the past is read from its end through accounting_entries_created
-- (00310), but a currency or an entry type was a filter on every entry on the way — a currency
-- with no entries, or the rare RefundIssued, read the whole ledger (382 ms to 1.25 s at a million
-- sessions, an outside review of plans at scale). Each filter gets its index in the page's order.
-- CONCURRENTLY, outside a transaction, like 00510: accounting_entries grows with every payment
-- and its writers must not wait for the build.
DROP INDEX CONCURRENTLY IF EXISTS accounting_entries_currency_created;
CREATE INDEX CONCURRENTLY accounting_entries_currency_created ON accounting_entries (currency, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS accounting_entries_type_created;
CREATE INDEX CONCURRENTLY accounting_entries_type_created ON accounting_entries (entry_type, created_at, id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS accounting_entries_type_created;
DROP INDEX CONCURRENTLY IF EXISTS accounting_entries_currency_created;
