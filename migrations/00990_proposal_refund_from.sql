-- +goose Up
-- A refund_settle proposal remembers the refund's status it was made on: Pending (flagged, the
-- patrol gave up) or Failed (settled so by hand, and paid by the gateway after all: corrected to
-- Succeeded, payments/refund_settle.go). The approval and the next proposal compare the refund
-- with it, and the resolutions page says "Failed → Succeeded". NULL on proposals filed before
-- this release: Pending, the only kind there was. A column without a default: no rewrite.
ALTER TABLE resolution_proposals ADD COLUMN refund_from text;

-- +goose Down
ALTER TABLE resolution_proposals DROP COLUMN refund_from;
