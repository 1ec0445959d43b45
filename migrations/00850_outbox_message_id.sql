-- +goose Up
-- A notifier message's "id" (what the receiver drops a retry by) was the outbox row's serial:
-- after a point-in-time restore the sequence hands a lost gap's ids out again, and two installs
-- sharing a receiver both count from 1, so a receiver dropped a new one-time code as a repeat
-- of another message (an outside review). New rows get a random UUID, the message's id on every
-- try of it; a row written before this release (message_id NULL) keeps its serial, which its
-- earlier tries were sent under (payments/notify.go).
--
-- Two statements: a column added without a default, then the default for new rows, change the
-- catalogue only; a volatile default in the ADD would rewrite the whole outbox under an ACCESS
-- EXCLUSIVE lock.
ALTER TABLE outbox ADD COLUMN message_id uuid;
ALTER TABLE outbox ALTER COLUMN message_id SET DEFAULT gen_random_uuid();

-- +goose Down
ALTER TABLE outbox DROP COLUMN message_id;
