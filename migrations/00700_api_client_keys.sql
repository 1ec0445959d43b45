-- +goose Up
-- Every key of a client (pitlane apikey rotate). Rotating used to mean a new client, and
-- everything keyed by the client stayed with the old one: a keyed refund retried under the new
-- key was a new request and a second refund. A rotated key is a row here naming its client, so
-- requests under any of its keys are the same client (idempotency keys, refunds' request keys,
-- scopes). Keys are authenticated and revoked here, one by one; a client whose keys are all
-- revoked is revoked.
--
-- api_clients keeps its first key's key_prefix and key_hash for a replica of the release before
-- during a rolling deploy: the trigger below copies a first key here whoever inserts it, and
-- revoking a first key alone overwrites its hash there with random bytes, so such a replica
-- refuses it too. Rotated keys work only on replicas of this release.
CREATE TABLE api_client_keys (
    key_prefix text PRIMARY KEY CHECK (key_prefix ~ '^pl_[0-9a-f]{12}$'),
    client_id  uuid NOT NULL REFERENCES api_clients (id) ON DELETE CASCADE,
    key_hash   bytea NOT NULL CHECK (length(key_hash) = 32),
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);
CREATE INDEX api_client_keys_client ON api_client_keys (client_id);

INSERT INTO api_client_keys (key_prefix, client_id, key_hash, created_at)
SELECT key_prefix, id, key_hash, created_at FROM api_clients;

-- +goose StatementBegin
CREATE FUNCTION api_client_first_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO api_client_keys (key_prefix, client_id, key_hash, created_at)
    VALUES (NEW.key_prefix, NEW.id, NEW.key_hash, NEW.created_at);
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER api_clients_first_key AFTER INSERT ON api_clients
    FOR EACH ROW EXECUTE FUNCTION api_client_first_key();

-- +goose Down
DROP TRIGGER api_clients_first_key ON api_clients;
DROP FUNCTION api_client_first_key();
DROP TABLE api_client_keys;
