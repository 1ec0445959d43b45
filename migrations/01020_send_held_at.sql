-- +goose Up
-- When a send that moves money (a registration, a reverse, a refund) was last held for this row
-- before it went to the gateway (payments.holdLeaseForSend, holdForRegistration, holdLateSend),
-- written in the hold's transaction, which commits before the send. A late first send's hold
-- (holdLateSend) takes the row only while this is NULL: it rested on the gateway call's log row,
-- written after the call and outside any transaction; a patrol drive cut by a stop with its
-- refund on the wire, whose log row could not be written (the session's row locked past
-- lock_timeout), left the refund looking untouched, and the late request sent it beside the
-- drive's (two refunds at a gateway that ignores keys, a review of stops). NULL on rows from
-- before this release. Columns without a default: no rewrite of either table.
ALTER TABLE payment_sessions ADD COLUMN send_held_at timestamptz;
ALTER TABLE refunds ADD COLUMN send_held_at timestamptz;

-- +goose Down
ALTER TABLE refunds DROP COLUMN send_held_at;
ALTER TABLE payment_sessions DROP COLUMN send_held_at;
