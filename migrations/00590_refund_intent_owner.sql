-- +goose Up
-- A keyless refund's intent (payment, amount; payments.RefundIntentKey) is the shop's, not one
-- API client's: two clients (two services of the shop, or one service half-way through a key
-- rotation) repeating the same refund within the window ask for the same refund. Its row in
-- idempotency_keys is owned by this reserved client (payments.RefundIntentOwner), shared by
-- every caller, so the key's one row decides between them as it does between two requests of
-- one client. It is never a credential: revoked, and no key hashes to 32 zero bytes; the API
-- client list leaves it out. While a rolling deploy runs, a replica of the release before
-- still writes the intent under the caller's own client.
INSERT INTO api_clients (id, name, key_prefix, key_hash, scopes, created_at, revoked_at)
VALUES ('00000000-0000-0000-0000-000000000000', 'keyless refund intents (every client; never a credential)',
        'pl_000000000000', decode(repeat('00', 32), 'hex'), '{refunds:write}', now(), now())
ON CONFLICT (id) DO NOTHING;

-- +goose Down
DELETE FROM idempotency_keys WHERE client_id = '00000000-0000-0000-0000-000000000000';
DELETE FROM api_clients WHERE id = '00000000-0000-0000-0000-000000000000';
