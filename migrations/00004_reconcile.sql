-- +goose Up
-- Reconciliation (payments/reconcile.go): one replica at a time compares the gateway's payments
-- with our sessions.

-- maintenance_leaders: who runs a maintenance job that must have one runner across replicas.
-- A row is a lease with a TTL, taken and renewed by one atomic statement
-- (INSERT … ON CONFLICT (job) DO UPDATE … WHERE the lease expired OR the owner is me RETURNING),
-- with the time passed in from the service clock. Nothing is held between statements: no
-- session-level advisory lock, nothing across a gateway call, so it works through pgbouncer in
-- transaction mode. A replica gives its rows back on graceful shutdown; a dead replica's row
-- simply expires.
CREATE TABLE maintenance_leaders (
    job        text PRIMARY KEY CHECK (length(job) BETWEEN 1 AND 128),
    owner      text NOT NULL CHECK (length(owner) BETWEEN 1 AND 128),
    elected_at timestamptz NOT NULL,
    until      timestamptz NOT NULL
);

-- reconcile_cursors: where reconciliation stands, so a long history is spread over runs and a new
-- leader continues where the old one stopped. A pass covers the sessions updated in
-- (pass_started_at - lookback, pass_started_at], in (updated_at, id) order; after_* is the last
-- session done. Written only by the leader, in the same transaction that renews its lease.
-- failures counts runs that could not get past the session after the cursor (gateway down);
-- after a few the session is skipped until the next pass.
CREATE TABLE reconcile_cursors (
    job              text PRIMARY KEY,
    pass_started_at  timestamptz,
    after_updated_at timestamptz,
    after_id         uuid,
    failures         integer NOT NULL DEFAULT 0,
    passes           bigint NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL,
    updated_by       text NOT NULL,
    CHECK ((after_updated_at IS NULL) = (after_id IS NULL))
);

-- The reconciler's keyset scan over one gateway's sessions by last change.
CREATE INDEX payment_sessions_gateway_updated ON payment_sessions (gateway, updated_at, id);

-- +goose Down
DROP INDEX payment_sessions_gateway_updated;
DROP TABLE reconcile_cursors, maintenance_leaders;
