-- +goose Up
-- The messages whose text still holds a code in clear (a delivered or skipped one keeps only its
-- redacted text). The housekeeping redacts those whose code is dead (consumed, superseded,
-- expired, out of attempts): without a notifier the outbox is the customer's channel and nothing
-- is ever delivered, so dead codes stayed in clear for good. The index holds the few live ones.
CREATE INDEX outbox_clear_codes ON outbox (id) WHERE redacted_body IS NOT NULL AND body <> redacted_body;

-- +goose Down
DROP INDEX outbox_clear_codes;
