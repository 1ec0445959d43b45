-- +goose Up
-- Which EVENTS_WEBHOOK_URL the events webhook's row delivers to (its SHA-256: the URL may carry
-- credentials) and when a replica with that URL last took the row. A replica configured with
-- another URL (a rolling change of the variable) takes the row only once no replica of the
-- row's URL has taken it for EventsWebhookHandover, so each URL gets one unbroken part of the
-- feed instead of alternate pages (payments/feed_push.go; an outside review). A replica of the
-- release before ignores both columns: change the URL only once every replica runs this one.
ALTER TABLE events_webhook ADD COLUMN url_hash text, ADD COLUMN url_seen_at timestamptz;

-- +goose Down
ALTER TABLE events_webhook DROP COLUMN url_hash, DROP COLUMN url_seen_at;
