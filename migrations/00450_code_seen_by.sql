-- +goose Up
-- Who saw a one-time code in the console's outbox (admins; the message still holds the code
-- while it is undelivered, and with no NOTIFY_WEBHOOK_URL the outbox is how codes reach
-- customers). A code proves that the customer agrees only when the person who confirms it did
-- not read it: an admin who requested a refund code, read it in the outbox and confirmed it
-- refunded any amount alone. The outbox page records its viewer on every challenge whose code it
-- shows, and a console confirmation by one of them is refused (payments.tryCode).
ALTER TABLE cancel_challenges ADD COLUMN seen_by text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE cancel_challenges DROP COLUMN seen_by;
