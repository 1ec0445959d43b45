-- +goose Up
-- reconcile_cursors.failures counted the runs in a row that failed, whichever session failed:
-- a session that failed twice and then left the pass's window (a webhook settled it) left its
-- count behind, and the next session's first failure skipped it until the next pass, a day later
-- for a payment the gateway holds as paid (an outside review). failing_id names the session the
-- count is of; another session starts from nothing. A replica of the release before neither
-- writes nor reads it: its runs count as before until the roll ends.
ALTER TABLE reconcile_cursors ADD COLUMN failing_id uuid;

-- +goose Down
ALTER TABLE reconcile_cursors DROP COLUMN failing_id;
