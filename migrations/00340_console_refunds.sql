-- +goose Up
-- Refunds from the console (issue 13; payments/code.go, payments/staff_refund.go,
-- payments/resolution.go).

-- Code-confirmed actions. cancel_challenges (named for the first of them) holds the one-time
-- code of every action a customer confirms: a cancel, and now a refund support starts. The
-- per-payment limits count every challenge of a payment whatever its action (a new code
-- replaces the earlier ones, 3 requests per hour, 10 wrong guesses per 24 hours), so asking
-- for a refund code never buys more guesses than asking for a cancel code would. A refund's
-- challenge carries what the code confirms (the amount) and the console form's intent key
-- (refunds.request_key of the refund it makes, so a double-submitted form finds it).
ALTER TABLE cancel_challenges ADD COLUMN action text NOT NULL DEFAULT 'cancel' CHECK (action IN ('cancel', 'refund'));
ALTER TABLE cancel_challenges ADD COLUMN amount bigint CHECK (amount > 0);
ALTER TABLE cancel_challenges ADD COLUMN request_key text;
ALTER TABLE cancel_challenges ADD CONSTRAINT cancel_challenges_refund_fields
    CHECK ((action = 'refund') = (amount IS NOT NULL AND request_key IS NOT NULL));

-- Four-eyes proposals of two kinds: settle (an outcome for a stuck session, as before) and
-- refund (a finance refund above REFUND_DIRECT_LIMIT). The machinery is one: proposed →
-- approved | rejected by guarded UPDATEs, the proposer never the approver (the four_eyes
-- constraint holds for both kinds).
ALTER TABLE resolution_proposals ADD COLUMN kind text NOT NULL DEFAULT 'settle' CHECK (kind IN ('settle', 'refund'));
ALTER TABLE resolution_proposals ALTER COLUMN outcome DROP NOT NULL;
ALTER TABLE resolution_proposals ADD COLUMN refund_amount bigint CHECK (refund_amount > 0);
ALTER TABLE resolution_proposals ADD COLUMN request_key text;
-- The refund its approval made (one transaction with the approval).
ALTER TABLE resolution_proposals ADD COLUMN refund_id uuid REFERENCES refunds (id);
ALTER TABLE resolution_proposals ADD CONSTRAINT resolution_proposals_kind_fields CHECK (
    (kind = 'settle' AND outcome IS NOT NULL AND refund_amount IS NULL AND request_key IS NULL AND refund_id IS NULL)
    OR (kind = 'refund' AND outcome IS NULL AND refund_amount IS NOT NULL AND request_key IS NOT NULL));
-- A refund proposal has a reason; its evidence is optional (a settle proposal needs both).
ALTER TABLE resolution_proposals DROP CONSTRAINT resolution_proposals_evidence_check;
ALTER TABLE resolution_proposals ADD CONSTRAINT resolution_proposals_evidence_check
    CHECK (length(evidence) <= 4000 AND (kind = 'refund' OR length(evidence) >= 1));
-- One approved settlement per session, as before; a session may have many approved refunds
-- (within the amount received: the refund core checks that under the order → session locks).
DROP INDEX resolution_proposals_one_approved;
CREATE UNIQUE INDEX resolution_proposals_one_approved ON resolution_proposals (session_id)
    WHERE state = 'approved' AND kind = 'settle';
-- One proposal per refund form: a double-submitted form finds the proposal its first submit made.
CREATE UNIQUE INDEX resolution_proposals_refund_key ON resolution_proposals (session_id, request_key)
    WHERE kind = 'refund';

-- +goose Down
DROP INDEX resolution_proposals_refund_key;
DROP INDEX resolution_proposals_one_approved;
DELETE FROM resolution_proposals WHERE kind = 'refund';
CREATE UNIQUE INDEX resolution_proposals_one_approved ON resolution_proposals (session_id) WHERE state = 'approved';
ALTER TABLE resolution_proposals DROP CONSTRAINT resolution_proposals_evidence_check;
ALTER TABLE resolution_proposals ADD CONSTRAINT resolution_proposals_evidence_check CHECK (length(evidence) BETWEEN 1 AND 4000);
ALTER TABLE resolution_proposals DROP CONSTRAINT resolution_proposals_kind_fields;
ALTER TABLE resolution_proposals DROP COLUMN refund_id;
ALTER TABLE resolution_proposals DROP COLUMN request_key;
ALTER TABLE resolution_proposals DROP COLUMN refund_amount;
ALTER TABLE resolution_proposals ALTER COLUMN outcome SET NOT NULL;
ALTER TABLE resolution_proposals DROP COLUMN kind;
DELETE FROM code_wrong_guesses WHERE challenge_id IN (SELECT id FROM cancel_challenges WHERE action = 'refund');
DELETE FROM cancel_challenges WHERE action = 'refund';
ALTER TABLE cancel_challenges DROP CONSTRAINT cancel_challenges_refund_fields;
ALTER TABLE cancel_challenges DROP COLUMN request_key;
ALTER TABLE cancel_challenges DROP COLUMN amount;
ALTER TABLE cancel_challenges DROP COLUMN action;
