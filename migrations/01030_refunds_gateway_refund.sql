-- +goose NO TRANSACTION
-- +goose Up
-- A refund answer naming a gateway refund another refund already holds — of this payment or of
-- another payment of the same gateway (a key store answering one key with another key's refund)
-- — is about that one, and is not booked (payments/refund.go driveRefund's apply): it was, and one
-- refund at the gateway was two RefundIssued entries (a review of gateway answers). The apply
-- looks the id up by this index; not unique: rows from before the rule may share one, and
-- refund ids of two gateways may be equal. CONCURRENTLY: the refunds' writers do not wait.
DROP INDEX CONCURRENTLY IF EXISTS refunds_gateway_refund;
CREATE INDEX CONCURRENTLY refunds_gateway_refund ON refunds (gateway_refund_id) WHERE gateway_refund_id IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS refunds_gateway_refund;
