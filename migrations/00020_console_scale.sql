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
-- Leases: the locks page and the dashboard's count read the few leased rows, not the table.
-- A released lease is NULL, so the index holds the sessions a patrol holds now (and the rare
-- lease a dead replica left on a session nobody drives any more).
CREATE INDEX payment_sessions_leased ON payment_sessions (lease_until, id) WHERE lease_until IS NOT NULL;

-- +goose Down
DROP INDEX payment_sessions_leased;
DROP INDEX payment_sessions_gateway_payment;
CREATE INDEX payment_sessions_status ON payment_sessions (status);
DROP INDEX payment_sessions_status_created;
DROP INDEX payment_sessions_created;
