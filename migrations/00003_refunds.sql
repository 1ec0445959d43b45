-- +goose Up
-- Refunds of Completed payments. The id is the gateway idempotency key; request_key binds a
-- refund to the request that asked for it (an API idempotency key or a derived intent), so
-- running the same request again finds the refund instead of creating a second one.
CREATE TABLE refunds (
    id                uuid PRIMARY KEY,
    session_id        uuid NOT NULL REFERENCES payment_sessions (id),
    order_id          text NOT NULL REFERENCES orders (order_id),
    amount            bigint NOT NULL CHECK (amount > 0),
    currency          text NOT NULL,
    status            text NOT NULL CHECK (status IN ('Pending', 'Succeeded', 'Failed')),
    request_key       text NOT NULL,
    gateway_refund_id text,
    detail            text NOT NULL DEFAULT '',
    next_check_at     timestamptz,
    check_attempts    integer NOT NULL DEFAULT 0,
    created_by        text NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    UNIQUE (session_id, request_key)
);
CREATE INDEX refunds_due ON refunds (next_check_at) WHERE status = 'Pending';

-- One RefundIssued ledger entry per refund, as a schema fact.
ALTER TABLE accounting_entries ADD COLUMN refund_id uuid REFERENCES refunds (id);
CREATE UNIQUE INDEX accounting_entries_one_per_refund ON accounting_entries (refund_id) WHERE refund_id IS NOT NULL;

-- +goose Down
DROP INDEX accounting_entries_one_per_refund;
ALTER TABLE accounting_entries DROP COLUMN refund_id;
DROP TABLE refunds;
