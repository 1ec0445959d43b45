-- +goose Up
-- The public JSON API's tables (payments/apiclients.go, payments/idempotency.go).

-- api_clients: the shop backends that call /api/v1. A key is shown once, at creation; only its
-- SHA-256 is kept. A fast hash is enough because the key is 256 random bits, not a password:
-- nothing can be guessed or brute-forced, and a slow KDF would only cost every request CPU.
-- key_prefix is the non-secret head of the key ("pl_" + 12 hex): people recognise a key by it,
-- the authenticator finds the row by it and then compares hashes in constant time.
CREATE TABLE api_clients (
    id         uuid PRIMARY KEY,
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    key_prefix text NOT NULL UNIQUE CHECK (key_prefix ~ '^pl_[0-9a-f]{12}$'),
    key_hash   bytea NOT NULL CHECK (length(key_hash) = 32),
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);

-- idempotency_keys: one row per (client, kind, key). kind 'key' is a client's Idempotency-Key
-- header; kind 'intent' is the business-intent key the server derives when the client sent none
-- (order, amount, currency, 5-minute window). A row is created atomically by the first request
-- (INSERT … ON CONFLICT DO NOTHING under pg_advisory_xact_lock), which holds it while it runs
-- (lock_token, locked_until); it then records what it did (resource_id, response_code).
-- A request that dies leaves locked_until behind: once it has passed, the same request may take
-- the row over. Never a cached response body: a replay reads the resource as it is now.
CREATE TABLE idempotency_keys (
    client_id     uuid NOT NULL REFERENCES api_clients (id),
    kind          text NOT NULL CHECK (kind IN ('key', 'intent')),
    key           text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    -- SHA-256 of method, path and canonical body: the same key with another request is refused.
    fingerprint   bytea NOT NULL,
    method        text NOT NULL,
    path          text NOT NULL,
    lock_token    uuid,
    locked_until  timestamptz,
    resource_id   uuid,
    response_code integer,
    created_at    timestamptz NOT NULL,
    completed_at  timestamptz,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (client_id, kind, key),
    -- completed rows name what they created; rows in flight hold a lock.
    CHECK ((completed_at IS NULL) = (resource_id IS NULL)),
    CHECK (completed_at IS NULL OR lock_token IS NULL)
);
-- The reaper's scan: expired rows, oldest first, in batches.
CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_at);

-- +goose Down
DROP TABLE idempotency_keys, api_clients;
