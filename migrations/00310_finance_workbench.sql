-- +goose Up
-- Finance's side of the console (issue 13): the stuck-money workbench, four-eyes manual
-- resolution and the ledger export (payments/finance_workbench.go, payments/resolution.go,
-- payments/ledger_export.go).

-- The workbench lists active sessions past their expected settle time (created_at older than
-- payments.SettleWithin), sorted by age or by amount, with keyset pagination, and sums them per
-- state and currency. Both orders get a partial index over the active states only, so the
-- list and its totals read the (small) active part of the table and never scan the (large)
-- settled part: at a million sessions a page is an index range read, not a sequential scan.
-- The status list must stay equal to payments.ActiveStatuses (the queries spell it as the same
-- literal, so the planner can prove the predicate even for generic plans).
-- INCLUDE makes the totals an index-only scan: status, currency and amount are all it sums.
CREATE INDEX payment_sessions_stuck_by_age ON payment_sessions (created_at, id)
    INCLUDE (status, currency, amount, flagged_at)
    WHERE status IN ('Registering', 'Registered', 'Unknown', 'Authorized', 'Canceling');
CREATE INDEX payment_sessions_stuck_by_amount ON payment_sessions (amount, id)
    WHERE status IN ('Registering', 'Registered', 'Unknown', 'Authorized', 'Canceling');

-- finance_check_claims: "Check now" on workbench rows. One row per session, claimed by one
-- INSERT … ON CONFLICT DO UPDATE … WHERE until <= now RETURNING, so of two concurrent bulk
-- checks (a double click, two people, two replicas) exactly one asks the gateway about a
-- session; the other is told who is checking it. The claim outlives the check by a short
-- cooldown, so a second click just after the first finished does not ask again either.
-- Nothing is held across the gateway call: the row is committed before it.
CREATE TABLE finance_check_claims (
    session_id uuid PRIMARY KEY REFERENCES payment_sessions (id),
    token      uuid NOT NULL,
    claimed_by text NOT NULL,
    claimed_at timestamptz NOT NULL,
    until      timestamptz NOT NULL
);

-- resolution_proposals: four-eyes manual resolution of a flagged, Unknown or mismatched session.
-- One person proposes an outcome with a reason and evidence; a second one approves (the
-- outcome is then applied through the one transition function, in the approval's transaction)
-- or rejects it. The state only moves proposed → approved | rejected, by guarded UPDATEs.
CREATE TABLE resolution_proposals (
    id                 bigserial PRIMARY KEY,
    session_id         uuid NOT NULL REFERENCES payment_sessions (id),
    order_id           text NOT NULL REFERENCES orders (order_id),
    outcome            text NOT NULL CHECK (outcome IN ('Completed', 'Failed', 'Canceled')),
    -- the session's status when proposed: approval refuses if it moved since (stale evidence)
    status_at_proposal text NOT NULL,
    reason             text NOT NULL CHECK (length(reason) BETWEEN 1 AND 2000),
    evidence           text NOT NULL CHECK (length(evidence) BETWEEN 1 AND 4000),
    state              text NOT NULL DEFAULT 'proposed' CHECK (state IN ('proposed', 'approved', 'rejected')),
    proposed_by        text NOT NULL,
    proposed_at        timestamptz NOT NULL,
    decided_by         text,
    decided_at         timestamptz,
    decision_note      text NOT NULL DEFAULT '',
    CONSTRAINT resolution_proposals_decided CHECK ((state = 'proposed') = (decided_at IS NULL AND decided_by IS NULL)),
    -- Four eyes as a schema fact: whatever code path approves, the approver is not the proposer.
    CONSTRAINT resolution_proposals_four_eyes CHECK (state <> 'approved' OR decided_by <> proposed_by)
);
-- At most one proposal waits per session (a second one would race the first to approval), and
-- at most one is ever approved.
CREATE UNIQUE INDEX resolution_proposals_one_open ON resolution_proposals (session_id) WHERE state = 'proposed';
CREATE UNIQUE INDEX resolution_proposals_one_approved ON resolution_proposals (session_id) WHERE state = 'approved';
CREATE INDEX resolution_proposals_recent ON resolution_proposals (proposed_at DESC, id DESC);

-- The ledger export and trial balance filter by date range; keyed like the export's order.
CREATE INDEX accounting_entries_created ON accounting_entries (created_at, id);

-- +goose Down
DROP INDEX accounting_entries_created;
DROP TABLE resolution_proposals, finance_check_claims;
DROP INDEX payment_sessions_stuck_by_amount;
DROP INDEX payment_sessions_stuck_by_age;
