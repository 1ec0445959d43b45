-- +goose NO TRANSACTION
-- +goose Up
-- A client key's request records the session it created in the claim's own transaction
-- (payments/idempotency.go, KeyBinding.recordOnly), before the gateway is asked and the key is
-- completed with the answer's code: if the request then fails (the answer could not be
-- written, the connection broke after the commit), the same request sent again replays that
-- session instead of running Create again. So resource_id may now be set on a key that is not
-- completed; a completed key still always has one.
--
-- Outside a transaction, one statement at a time: dropping a CHECK takes a brief ACCESS
-- EXCLUSIVE lock and reads nothing; the new one is added NOT VALID (no scan under that lock) and
-- validated after, which reads the table (30 days of keys) under a lock that lets requests
-- write on. Every row already satisfies it (the old CHECK was stricter). Each statement may run
-- again after a failure half-way. A replica of the release before never sets resource_id
-- without completed_at, so a rolling deploy works either way.
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_check;
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_completed_names_resource;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_completed_names_resource
    CHECK (completed_at IS NULL OR resource_id IS NOT NULL) NOT VALID;
ALTER TABLE idempotency_keys VALIDATE CONSTRAINT idempotency_keys_completed_names_resource;

-- +goose Down
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_completed_names_resource;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_check
    CHECK ((completed_at IS NULL) = (resource_id IS NULL)) NOT VALID;
