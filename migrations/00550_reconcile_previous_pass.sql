-- +goose Up
-- Where the previous reconciliation pass started. A pass's window is its start minus the
-- lookback (ReconcileConfig.Lookback, 7 days) up to its start; a pass that took longer than the
-- lookback (over a million sessions a week at the default batch) left the sessions updated
-- between the previous pass's start and the new window's bottom compared by neither (an outside
-- review). The next pass now reaches down to the previous start when that is older. A nullable
-- column: instant, and a replica of the release before leaves it as it is.
ALTER TABLE reconcile_cursors ADD COLUMN prev_pass_started_at timestamptz;

-- +goose Down
ALTER TABLE reconcile_cursors DROP COLUMN prev_pass_started_at;
