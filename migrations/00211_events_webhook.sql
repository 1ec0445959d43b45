-- +goose Up
-- The events webhook (EVENTS_WEBHOOK_URL, payments/feed_push.go): the events feed POSTed to the
-- shop. One row: where delivery stands in the feed, and who delivers now. A replica takes the
-- row for one batch with a lease (never a lock held across the POST), moves the cursor only
-- while its lease token is still the row's, and gives the row back; a failed POST waits
-- next_attempt_at (doubling, at most five minutes) before any replica tries again.
CREATE TABLE events_webhook (
    id               int PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    cursor           text NOT NULL,         -- the last event delivered ('' : none, from the feed's start)
    started_at       timestamptz NOT NULL,  -- when delivery began (at the feed's end then)
    lease_owner      text,
    lease_until      timestamptz,
    lease_token      uuid,
    attempts         integer NOT NULL DEFAULT 0, -- failed POSTs in a row
    next_attempt_at  timestamptz,
    last_error       text NOT NULL DEFAULT '',
    delivered_at     timestamptz,
    delivered_events bigint NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE events_webhook;
