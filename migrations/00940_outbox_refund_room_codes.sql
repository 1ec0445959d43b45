-- +goose NO TRANSACTION
-- +goose Up
-- A refund code whose refund no longer fits what the payment has left (the shop's API refunded
-- it meanwhile, or a refund proposal waiting for approval holds the rest) can only be refused
-- ("refunds would exceed the amount received"): the outbox's retry (payments/notify.go) skips
-- its message with the reason 'no_room' instead of asking the customer to read out a code for a
-- refund that cannot be made. As 00920: the wider rule NOT VALID in the statement that drops the
-- old one, then validated under SHARE UPDATE EXCLUSIVE.
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_skip_reason_check,
    ADD CONSTRAINT outbox_skip_reason_check
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired', 'spent', 'finished', 'no_room')) NOT VALID;
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_skip_reason_check;

-- +goose Down
UPDATE outbox SET skip_reason = 'expired' WHERE skip_reason = 'no_room';
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_skip_reason_check,
    ADD CONSTRAINT outbox_skip_reason_check
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired', 'spent', 'finished'));
