-- +goose Up
-- Refunds in the events feed (payments/feed.go): every status change of a refund — its claim as
-- Pending, then Succeeded or Failed — is a row here, written in the same statement as the change
-- itself (payments/refund.go), with the writing transaction's id like session_events' (00210
-- says why the feed orders by it). The ids come from session_events' own sequence, so a cursor
-- "<xid>-<id>" names one row of either table and the feed's order stays total within a
-- transaction. Refunds made before this migration have no rows: the feed starts with it.
CREATE TABLE refund_events (
    id          bigint PRIMARY KEY DEFAULT nextval('session_events_id_seq'),
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    refund_id   uuid NOT NULL REFERENCES refunds (id),
    from_status text,
    to_status   text NOT NULL,
    actor_kind  text NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX refund_events_feed ON refund_events (xid, id);
CREATE INDEX refund_events_refund ON refund_events (refund_id);

-- +goose Down
DROP TABLE refund_events;
