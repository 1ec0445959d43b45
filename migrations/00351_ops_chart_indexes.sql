-- +goose NO TRANSACTION
-- +goose Up
-- Time-range indexes for the Operations page (payments/console_charts.go, ops_samples.go).
-- gateway_calls and session_events are the two tables that grow with every gateway call and
-- every status change; without these, "calls per minute over the last hour" and "sessions
-- settled in the last minute" read the whole table. Both tables are append-only and written in
-- created_at order, so the indexes grow at their right edge only, and the INCLUDE columns make
-- the charts' aggregates index-only scans (the visibility map of an append-only table stays set).
--
-- CONCURRENTLY, outside a transaction (hence NO TRANSACTION): these are the largest tables, and
-- a plain CREATE INDEX would stop every gateway call log and every transition for the length of
-- the build. A build that fails half-way leaves an INVALID index behind and the migration
-- unapplied; each index is dropped first, so running `pitlane migrate` again builds it anew
-- instead of keeping the broken one.
DROP INDEX CONCURRENTLY IF EXISTS gateway_calls_created;
CREATE INDEX CONCURRENTLY gateway_calls_created ON gateway_calls (created_at) INCLUDE (outcome, latency_ms);
DROP INDEX CONCURRENTLY IF EXISTS session_events_created;
CREATE INDEX CONCURRENTLY session_events_created ON session_events (created_at) INCLUDE (to_status);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS session_events_created;
DROP INDEX CONCURRENTLY IF EXISTS gateway_calls_created;
