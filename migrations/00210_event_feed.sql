-- +goose NO TRANSACTION
-- +goose Up
-- The events feed (GET /api/v1/events, payments/events.go): every status change of every
-- payment, in an order that never lets a reader skip one. session_events.id is taken when the
-- row is inserted, not when its transaction commits: a transition still open with id 10 is
-- invisible to a reader who sees 11 committed, and a cursor "after 11" would skip 10 for ever.
-- The feed orders by the writing transaction's id instead (xid, then id within it) and serves
-- only rows whose transaction is older than the oldest one still running
-- (pg_snapshot_xmin(pg_current_snapshot())): every transaction that can still commit a row has
-- a larger xid than anything served, so nothing can appear behind a cursor.
--
-- The column has no default in ADD COLUMN (a volatile default would rewrite the table); the
-- default is set after it, so rows written before this migration keep NULL and are not in the
-- feed (their payments' state is what GET /api/v1/payments/{id} says). The index is built
-- CONCURRENTLY (hence NO TRANSACTION), like 00351's on this table; each step can run again after
-- a failure half-way.
ALTER TABLE session_events ADD COLUMN IF NOT EXISTS xid xid8;
ALTER TABLE session_events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();
DROP INDEX CONCURRENTLY IF EXISTS session_events_feed;
CREATE INDEX CONCURRENTLY session_events_feed ON session_events (xid, id) WHERE xid IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS session_events_feed;
ALTER TABLE session_events DROP COLUMN IF EXISTS xid;
