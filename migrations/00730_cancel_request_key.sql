-- +goose Up
-- The console's "Request cancel" form carries an intent key too (payments/cancel.go
-- RequestCancelOnce): the same form sent again while its code is open answers that code and sends
-- the customer nothing. A double click sent two codes, the first dead on arrival, and spent two of
-- the payment's three code requests of the hour (an outside review). A cancel's challenge may now
-- carry the key; a refund's still must, with its amount.
ALTER TABLE cancel_challenges DROP CONSTRAINT cancel_challenges_refund_fields;
ALTER TABLE cancel_challenges ADD CONSTRAINT cancel_challenges_refund_fields
    CHECK ((action = 'refund') = (amount IS NOT NULL) AND (action <> 'refund' OR request_key IS NOT NULL));

-- +goose Down
UPDATE cancel_challenges SET request_key = NULL WHERE action = 'cancel';
ALTER TABLE cancel_challenges DROP CONSTRAINT cancel_challenges_refund_fields;
ALTER TABLE cancel_challenges ADD CONSTRAINT cancel_challenges_refund_fields
    CHECK ((action = 'refund') = (amount IS NOT NULL AND request_key IS NOT NULL));
