-- +goose NO TRANSACTION
-- +goose Up
-- The resolutions page (handlers/console_resolutions.go) lists the proposals waiting for a second
-- person oldest first (the one waiting longest is decided first, and never the one a limit cuts
-- off) and counts them, and lists the latest decisions by when they were decided (a decision on
-- an old proposal is news too). Its lists were the newest proposals by proposed_at with the
-- decided ones picked out, which hid every decision on a proposal older than the newest 100.
-- Partial indexes, CONCURRENTLY outside a transaction like 00640: each list is one index range.
DROP INDEX CONCURRENTLY IF EXISTS resolution_proposals_queue;
CREATE INDEX CONCURRENTLY resolution_proposals_queue ON resolution_proposals (proposed_at, id) WHERE state = 'proposed';
DROP INDEX CONCURRENTLY IF EXISTS resolution_proposals_decided;
CREATE INDEX CONCURRENTLY resolution_proposals_decided ON resolution_proposals (decided_at DESC, id DESC) WHERE state <> 'proposed';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS resolution_proposals_decided;
DROP INDEX CONCURRENTLY IF EXISTS resolution_proposals_queue;
