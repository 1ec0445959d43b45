-- +goose Up
-- The webhook inbox: every gateway event that passed signature verification, once per
-- (gateway, event id). Events are hints (gateway-api.md): what is applied is what the gateway
-- says when asked, through the same Check path as everything else. This table only makes a
-- redelivered event cheap and harmless, and keeps a record of what arrived and what became of it.
--
-- A row is processed (processed_at set) only after the hint was applied, or found to concern no
-- session of ours. A delivery that failed to apply (gateway down, lock timeout) leaves the row
-- unprocessed with its error and answers 5xx, so the gateway's redelivery applies it.
--
-- claim_token/claimed_until: the delivery working on the event right now. Copies arriving
-- meanwhile answer 200 without asking the gateway again; a claim whose holder died expires, and
-- the next redelivery takes it over.
CREATE TABLE webhook_events (
    id                 bigserial PRIMARY KEY,
    gateway            text NOT NULL,
    event_id           text NOT NULL,
    event_type         text NOT NULL DEFAULT '',
    gateway_payment_id text,
    reference          text,
    session_id         uuid REFERENCES payment_sessions (id),
    deliveries         integer NOT NULL DEFAULT 1,
    received_at        timestamptz NOT NULL,
    last_received_at   timestamptz NOT NULL,
    claim_token        uuid,
    claimed_until      timestamptz,
    processed_at       timestamptz,
    -- applied: the hint went through Check; unknown_payment: no session of ours has that gateway
    -- payment or reference; ignored: the event concerns no payment (e.g. a Stripe account event).
    outcome            text CHECK (outcome IN ('applied', 'unknown_payment', 'ignored')),
    error              text,
    CONSTRAINT webhook_events_event UNIQUE (gateway, event_id)
);
CREATE INDEX webhook_events_unprocessed ON webhook_events (received_at) WHERE processed_at IS NULL;
CREATE INDEX webhook_events_payment ON webhook_events (gateway, gateway_payment_id);
CREATE INDEX webhook_events_session ON webhook_events (session_id) WHERE session_id IS NOT NULL;

-- +goose Down
DROP TABLE webhook_events;
