-- +goose Up
-- A message that carries a secret (a one-time cancel code) keeps it in the outbox only until it
-- is delivered: it is retried from there. delivered_body is the same text with the secret
-- replaced, written with the message; delivery swaps it in, so the contract's "codes are never
-- stored in clear after delivery" holds. NULL: the message has nothing to hide.
ALTER TABLE outbox ADD COLUMN delivered_body text;

-- +goose Down
ALTER TABLE outbox DROP COLUMN delivered_body;
