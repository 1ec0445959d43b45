-- +goose Up
-- refund_events named only the kind of whoever moved a refund ("sweeper", "api", "staff"):
-- which replica settled it, which API client claimed it, which person approved an outcome by
-- hand had to be pieced together from gateway_calls, refunds.created_by or the audit log (an
-- outside review of audit completeness). actor_id names them as session_events' actor_id does.
-- Rows written before have '' (unknown). A constant default: no table rewrite.
ALTER TABLE refund_events ADD COLUMN actor_id text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE refund_events DROP COLUMN actor_id;
