-- +goose Up
-- The flagged refunds (payments.ListFlaggedRefunds: /finance/flagged, refreshed live on every
-- refund change) are read through this partial index, never by walking every refund: it holds
-- only the few whose schedule ran out still Pending.
CREATE INDEX refunds_flagged ON refunds (flagged_at, id) WHERE flagged_at IS NOT NULL AND status = 'Pending';

-- +goose Down
DROP INDEX refunds_flagged;
