-- +goose NO TRANSACTION
-- +goose Up
-- A cancel code of a payment that has finished (Completed, Failed, Canceled) can only be
-- refused ("a Completed payment cannot be canceled"): the outbox's retry (payments/notify.go)
-- skips its message with the reason 'finished' instead of telling the customer a code to cancel
-- a payment that is over. As 00650: the wider rule NOT VALID in the statement that drops the
-- old one, then validated under SHARE UPDATE EXCLUSIVE.
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_skip_reason_check,
    ADD CONSTRAINT outbox_skip_reason_check
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired', 'spent', 'finished')) NOT VALID;
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_skip_reason_check;

-- +goose Down
UPDATE outbox SET skip_reason = 'expired' WHERE skip_reason = 'finished';
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_skip_reason_check,
    ADD CONSTRAINT outbox_skip_reason_check
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired', 'spent'));
