-- +goose Up
-- A cancel code's message names its challenge, so the outbox's retry (payments/notify.go) can
-- see that the code is no use any more before sending it: a newer code superseded it, or it was
-- consumed (the first delivery reached the customer after all and they read it out), or it
-- expired. Such a message is not sent; it is marked instead, and its code redacted.
-- Rows from before this migration name no challenge; their codes are dead after CodeTTL anyway.
ALTER TABLE outbox ADD COLUMN challenge_id uuid REFERENCES cancel_challenges (id);
-- When the retry decided not to send the message, and why: 'superseded', 'consumed', 'expired'.
ALTER TABLE outbox ADD COLUMN skipped_at timestamptz;
ALTER TABLE outbox ADD COLUMN skip_reason text
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired'));
ALTER TABLE outbox ADD CONSTRAINT outbox_skipped_with_reason
    CHECK ((skipped_at IS NULL) = (skip_reason IS NULL));

-- +goose Down
ALTER TABLE outbox DROP CONSTRAINT outbox_skipped_with_reason;
ALTER TABLE outbox DROP COLUMN skip_reason;
ALTER TABLE outbox DROP COLUMN skipped_at;
ALTER TABLE outbox DROP COLUMN challenge_id;
