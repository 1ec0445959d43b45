-- +goose Up
-- How far the replica's clock is from the database's, measured with each heartbeat (the
-- replica's time minus clock_timestamp() when the row is written, in milliseconds; the round
-- trip's time is in it too). Leases, deadlines and due times are compared with the clock of the
-- replica that writes or reads them (payments/clock.go): a replica whose clock runs seconds
-- ahead takes other replicas' leases before they end, one behind holds its own past them (an
-- outside review). The metric pitlane_patrol_clock_offset_seconds and its alert make it seen.
-- Nullable: a replica of the release before writes none.
ALTER TABLE sweeper_heartbeats ADD COLUMN clock_offset_ms bigint;

-- +goose Down
ALTER TABLE sweeper_heartbeats DROP COLUMN clock_offset_ms;
