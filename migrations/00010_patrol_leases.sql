-- +goose Up
-- The patrol at gateway speed (payments/patrol.go): leases that hold, one shape for every kind of
-- work the patrol drives (sessions, refunds, outbox messages), and a heartbeat per replica.
--
-- A lease is (lease_owner, lease_until, lease_token). The token is a fresh uuid per claim: the
-- drive applies its result and gives the lease back only while the row still carries its token
-- (guarded UPDATE … WHERE lease_token = $token), so a drive that outlived its lease and was taken
-- over applies and releases nothing. The owner is for people (console, logs); it decides nothing:
-- two processes may carry one REPLICA_ID (a restarted container, two workers of one pool).
ALTER TABLE payment_sessions ADD COLUMN lease_token uuid;

-- Refunds get the sessions' schedule semantics: leased while driven, rescheduled on the same
-- backoff schedule, flagged for finance (with a case) when it runs out, never retried forever.
ALTER TABLE refunds
    ADD COLUMN lease_owner text,
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN lease_token uuid,
    ADD COLUMN flagged_at  timestamptz,
    ADD COLUMN flag_reason text;
DROP INDEX refunds_due;
CREATE INDEX refunds_due ON refunds (next_check_at) WHERE status = 'Pending' AND flagged_at IS NULL;

-- Outbox deliveries are leased the same way (next_attempt_at keeps meaning "not before").
ALTER TABLE outbox
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN lease_token uuid;

-- sweeper_heartbeats: one row per replica, written by its patrol every round (and every
-- SWEEP_INTERVAL during a long one). What "is this replica sweeping?" is judged from: beat_at
-- (alive), last_sweep_at (last time it looked for due work), in_flight (leases it drives right
-- now), and the back-off it imposed on itself after a round in which the gateway mostly failed.
-- Rows of replicas gone for a day are reaped by housekeeping.
CREATE TABLE sweeper_heartbeats (
    replica_id         text PRIMARY KEY CHECK (length(replica_id) BETWEEN 1 AND 128),
    version            text NOT NULL DEFAULT '',
    concurrency        integer NOT NULL,
    started_at         timestamptz NOT NULL,
    beat_at            timestamptz NOT NULL,
    last_sweep_at      timestamptz,
    in_flight          integer NOT NULL DEFAULT 0,
    backoff_until      timestamptz,
    backoff_reason     text NOT NULL DEFAULT '',
    last_round_driven  integer NOT NULL DEFAULT 0,
    last_round_calls   integer NOT NULL DEFAULT 0,
    last_round_failed  integer NOT NULL DEFAULT 0,
    driven_total       bigint NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE sweeper_heartbeats;
ALTER TABLE outbox DROP COLUMN lease_until, DROP COLUMN lease_token;
DROP INDEX refunds_due;
CREATE INDEX refunds_due ON refunds (next_check_at) WHERE status = 'Pending';
ALTER TABLE refunds DROP COLUMN lease_owner, DROP COLUMN lease_until, DROP COLUMN lease_token,
    DROP COLUMN flagged_at, DROP COLUMN flag_reason;
ALTER TABLE payment_sessions DROP COLUMN lease_token;
