-- +goose Up
-- A refund proposal remembers the payment's refunds when it was filed (their ids, read under
-- the order's lock the proposal takes): its approval is refused after a refund of the shop's API
-- made since, which the proposal does not hold back and which may be the very refund it asks
-- for (payments/staff_refund.go, approveRefund). Compared by time before, and a shop refund
-- stamped by a replica whose clock ran behind, or that read its time before waiting for the
-- order's lock, slipped past (a review of that rule). NULL on proposals filed before this
-- release: those fall back on the time. A column without a default: no rewrite of the table.
ALTER TABLE resolution_proposals ADD COLUMN refunds_seen uuid[];

-- +goose Down
ALTER TABLE resolution_proposals DROP COLUMN refunds_seen;
