-- +goose Up
-- Retrying undelivered customer messages: next_attempt_at doubles as the claim (a replica that
-- takes a message pushes it into the future first, so no other replica sends it meanwhile).
ALTER TABLE outbox ADD COLUMN next_attempt_at timestamptz;
CREATE INDEX outbox_undelivered ON outbox (next_attempt_at) WHERE delivered_at IS NULL;

-- +goose Down
DROP INDEX outbox_undelivered;
ALTER TABLE outbox DROP COLUMN next_attempt_at;
