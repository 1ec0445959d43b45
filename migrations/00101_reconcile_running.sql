-- +goose Up
-- On-demand reconciliation (`pitlane reconcile`, payments.ReconcileSince) shares the patrol's
-- one-runner lease in maintenance_leaders. The patrol's leader keeps its row between its runs
-- (leadership is sticky: the same replica reconciles every minute), so "the row is held" cannot
-- tell an on-demand run whether a comparison is under way right now. running_until can: every
-- run sets it with each take or renewal of the lease (the same statement, the same TTL) and
-- clears it when the run ends; a run that died mid-way leaves it to expire with the lease.
-- An on-demand run may take the row over from a leader that is between runs (running_until
-- NULL or past), never from one that is running; patrols never take it from a live leader.
ALTER TABLE maintenance_leaders ADD COLUMN running_until timestamptz;

-- +goose Down
ALTER TABLE maintenance_leaders DROP COLUMN running_until;
