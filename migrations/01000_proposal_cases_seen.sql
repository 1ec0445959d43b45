-- +goose Up
-- A settlement proposal (of a payment's outcome, or of a refund's) remembers the payment's open
-- finance cases as they were read when it was filed (each as "id:" and the case's version,
-- payments.caseSeenSQL, under the order's lock the proposal takes): its approval is refused when a
-- case was opened or had news since, which neither the proposer nor the approver was shown (a
-- review: a capture of 1.00 of a 99.00 payment found after a proposal of Completed was booked as
-- 99.00 received, its case closed). NULL on proposals filed before this release, and on refund
-- proposals: those are not compared. A column without a default: no rewrite of the table.
ALTER TABLE resolution_proposals ADD COLUMN cases_seen text[];

-- +goose Down
ALTER TABLE resolution_proposals DROP COLUMN cases_seen;
