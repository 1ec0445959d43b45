-- +goose NO TRANSACTION
-- +goose Up
-- A cancel code whose challenge ran out of guesses is as dead as a superseded one: ConfirmCancel
-- refuses it for good (a challenge's attempts only grow; UnlockCodes clears the payment's lock,
-- not a challenge's count). The outbox's retry (payments/notify.go) skips its message with the
-- reason 'spent' instead of sending a code that can only be refused.
-- The wider rule is added NOT VALID in the statement that drops the old one (a moment's ACCESS
-- EXCLUSIVE, no scan; rerunnable), then validated under SHARE UPDATE EXCLUSIVE, which lets the
-- outbox's writers (every cancel request) go on while it reads the table.
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_skip_reason_check,
    ADD CONSTRAINT outbox_skip_reason_check
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired', 'spent')) NOT VALID;
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_skip_reason_check;

-- +goose Down
UPDATE outbox SET skip_reason = 'expired' WHERE skip_reason = 'spent';
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_skip_reason_check,
    ADD CONSTRAINT outbox_skip_reason_check
    CHECK (skip_reason IN ('superseded', 'consumed', 'expired'));
