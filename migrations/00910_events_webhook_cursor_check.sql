-- +goose Up
-- events_webhook.cursor is an event id the feed returned (or '' for the feed's start), and the
-- runbook has operators set it by hand to send again from an earlier point. A value that is not
-- one ('end', the feed API's word for its end, or an id pasted with a space) was taken: every
-- replica's stats then failed (pitlane_stats_up 0, every database gauge gone) and the webhook
-- stopped without counting a failure (an outside review). Refused on the spot now. NOT VALID: a
-- row already holding such a value is not a reason to fail the upgrade (the code copes with it).
ALTER TABLE events_webhook ADD CONSTRAINT events_webhook_cursor_is_an_event_id
    CHECK (cursor ~ '^([0-9]{1,20}-[0-9]{1,19})?$') NOT VALID;

-- +goose Down
ALTER TABLE events_webhook DROP CONSTRAINT events_webhook_cursor_is_an_event_id;
