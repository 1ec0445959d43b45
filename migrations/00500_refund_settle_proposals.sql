-- +goose Up
-- A refund settled by hand with four eyes (payments/refund_settle.go): when a refund's patrol
-- schedule ran out still Pending and the gateway will not say more ("retry now" asks again and
-- hears "pending" again), finance proposes what happened, Succeeded or Failed, with the evidence
-- (the gateway's support, a bank statement), and a second person approves. A third kind of
-- the same proposals: it names the refund (refund_id) and its outcome (refund_outcome); the
-- session's own outcome column stays empty.
ALTER TABLE resolution_proposals ADD COLUMN refund_outcome text CHECK (refund_outcome IN ('Succeeded', 'Failed'));
ALTER TABLE resolution_proposals DROP CONSTRAINT resolution_proposals_kind_check;
ALTER TABLE resolution_proposals ADD CONSTRAINT resolution_proposals_kind_check
    CHECK (kind IN ('settle', 'refund', 'refund_settle'));
ALTER TABLE resolution_proposals DROP CONSTRAINT resolution_proposals_kind_fields;
ALTER TABLE resolution_proposals ADD CONSTRAINT resolution_proposals_kind_fields CHECK (
    (kind = 'settle' AND outcome IS NOT NULL AND refund_amount IS NULL AND request_key IS NULL AND refund_id IS NULL AND refund_outcome IS NULL)
    OR (kind = 'refund' AND outcome IS NULL AND refund_amount IS NOT NULL AND request_key IS NOT NULL AND refund_outcome IS NULL)
    OR (kind = 'refund_settle' AND outcome IS NULL AND refund_amount IS NULL AND request_key IS NULL
        AND refund_id IS NOT NULL AND refund_outcome IS NOT NULL));

-- +goose Down
DELETE FROM resolution_proposals WHERE kind = 'refund_settle';
ALTER TABLE resolution_proposals DROP CONSTRAINT resolution_proposals_kind_fields;
ALTER TABLE resolution_proposals ADD CONSTRAINT resolution_proposals_kind_fields CHECK (
    (kind = 'settle' AND outcome IS NOT NULL AND refund_amount IS NULL AND request_key IS NULL AND refund_id IS NULL)
    OR (kind = 'refund' AND outcome IS NULL AND refund_amount IS NOT NULL AND request_key IS NOT NULL));
ALTER TABLE resolution_proposals DROP CONSTRAINT resolution_proposals_kind_check;
ALTER TABLE resolution_proposals ADD CONSTRAINT resolution_proposals_kind_check CHECK (kind IN ('settle', 'refund'));
ALTER TABLE resolution_proposals DROP COLUMN refund_outcome;
