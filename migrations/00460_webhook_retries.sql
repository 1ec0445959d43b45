-- +goose Up
-- The patrol retries a webhook event whose apply failed, instead of waiting for the gateway to
-- deliver it again. A copy that arrives while the first delivery is still applying is answered
-- 200 (the contract: a duplicate is acknowledged), and the gateway may count that 200 as the
-- event delivered: when the first delivery then fails, no redelivery comes. retry_at is when the
-- patrol may try the event again (the looks' schedule by attempts); a receiver's delivery or a
-- retry claims the event the same way (claim_token, claimed_until), so they never apply it at once.
ALTER TABLE webhook_events ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN retry_at timestamptz;
DROP INDEX webhook_events_unprocessed;
CREATE INDEX webhook_events_unprocessed ON webhook_events (coalesce(retry_at, received_at)) WHERE processed_at IS NULL;

-- +goose Down
DROP INDEX webhook_events_unprocessed;
CREATE INDEX webhook_events_unprocessed ON webhook_events (received_at) WHERE processed_at IS NULL;
ALTER TABLE webhook_events DROP COLUMN retry_at, DROP COLUMN attempts;
