-- +goose Up
-- The console at a million sessions (issue 12: `make bench`'s console figure EXPLAINs every
-- statement of every page; none may read payment_sessions sequentially).
--
-- The payments list is newest first, optionally of one status: (created_at, id) serves the
-- plain list and its keyset pages (read backwards), (status, created_at, id) the status filter
-- and, being led by status, everything the old single-column status index served.
CREATE INDEX payment_sessions_created ON payment_sessions (created_at, id);
CREATE INDEX payment_sessions_status_created ON payment_sessions (status, created_at, id);
DROP INDEX payment_sessions_status;
-- The search box matches a gateway payment id too: without this the OR of the list's search
-- has one arm no index answers, and the whole OR becomes a sequential scan.
CREATE INDEX payment_sessions_gateway_payment ON payment_sessions (gateway_payment_id) WHERE gateway_payment_id IS NOT NULL;
-- Leases are deliberately not indexed: a patrol's claim only sets lease columns, so it can be a
-- heap-only (HOT) update that touches no index; an index on lease_until made every claim write
-- every index of the table and slowed the drain at 0 ms by a third (make bench). The locks page
-- and the dashboard's lease count read leases among the active sessions, through the partial
-- indexes over them (00310): a lease matters only while its session can still be driven.

-- +goose Down
DROP INDEX payment_sessions_gateway_payment;
CREATE INDEX payment_sessions_status ON payment_sessions (status);
DROP INDEX payment_sessions_status_created;
DROP INDEX payment_sessions_created;
