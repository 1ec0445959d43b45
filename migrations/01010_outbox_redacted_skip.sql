-- +goose NO TRANSACTION
-- +goose Up
-- A code message whose text no longer holds its code (redacted by the housekeeping while its
-- code could not be used and its delivery was on the wire; the delivery then failed) is never
-- sent: once the code could be used again (a refund's room back, an admin having read the
-- outbox) its retry sent "your code is ••••••" and marked it delivered (a review of outbound
-- deliveries). The outbox skips it with the reason 'redacted' (payments/notify.go). As 00940: the
-- wider rule NOT VALID in the statement that drops the old one, then validated under SHARE
-- UPDATE EXCLUSIVE.
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_skip_reason_check,
    ADD CONSTRAINT outbox_skip_reason_check
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired', 'spent', 'finished', 'no_room', 'redacted')) NOT VALID;
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_skip_reason_check;

-- +goose Down
UPDATE outbox SET skip_reason = 'expired' WHERE skip_reason = 'redacted';
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_skip_reason_check,
    ADD CONSTRAINT outbox_skip_reason_check
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired', 'spent', 'finished', 'no_room'));
