-- +goose NO TRANSACTION
-- +goose Up
-- CODE_REQUESTS_PER_CONTACT_PER_HOUR (payments.Config.CodeRequestsPerContact) counts the code
-- messages sent to one customer contact within the last hour, across its payments, each time a
-- code is asked for (payments/code.go contactCodesAllowed). The outbox keeps every message ever
-- written; the count reads this index's range for the contact and the hour. CONCURRENTLY,
-- outside a transaction, like 00930: the outbox's writers must not wait for the build (a build
-- cut short leaves an invalid index, dropped first when the migration runs again).
DROP INDEX CONCURRENTLY IF EXISTS outbox_code_contact;
CREATE INDEX CONCURRENTLY outbox_code_contact ON outbox (lower(to_addr), created_at) WHERE challenge_id IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_code_contact;
