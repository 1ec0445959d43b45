-- +goose Up
-- The locking core's tables (payments/). Status values are checked here as well as in Go so that
-- code bypassing the transition function still cannot write a status the state machine lacks.

-- orders: the shop's orders as pitlane knows them. The order row is the first lock of every
-- money-moving transaction (lock order: order → session → finance).
CREATE TABLE orders (
    order_id          text PRIMARY KEY CHECK (order_id ~ '^[A-Za-z0-9._:-]{1,64}$'),
    status            text NOT NULL DEFAULT 'AwaitingPayment' CHECK (status IN ('AwaitingPayment', 'Paid')),
    active_session_id uuid,
    paid_session_id   uuid,
    customer_contact  text,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);

CREATE TABLE payment_sessions (
    id                 uuid PRIMARY KEY,
    order_id           text NOT NULL REFERENCES orders (order_id),
    amount             bigint NOT NULL CHECK (amount > 0 AND amount < 1000000000000),
    currency           text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status             text NOT NULL CHECK (status IN ('Registering', 'Registered', 'Unknown', 'Authorized',
                                                       'Completed', 'Failed', 'Canceling', 'Canceled')),
    gateway            text NOT NULL,
    gateway_payment_id text,
    confirmation_url   text,
    customer_contact   text,
    -- sweeper bookkeeping: when the night patrol should look next, how often it has looked,
    -- and who holds the lease right now (lease_until in the past = free).
    next_check_at      timestamptz,
    check_attempts     integer NOT NULL DEFAULT 0,
    lease_owner        text,
    lease_until        timestamptz,
    -- set when the sweeper's schedule ran out: a human (finance) must look; never a silent Failed.
    flagged_at         timestamptz,
    flag_reason        text,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL
);

-- The second line of defence behind the advisory lock of Create: at most one active session per
-- order, whatever code path inserts or updates it.
CREATE UNIQUE INDEX payment_sessions_one_active_per_order ON payment_sessions (order_id)
    WHERE status IN ('Registering', 'Registered', 'Unknown', 'Authorized', 'Canceling');
-- One gateway payment belongs to one session.
CREATE UNIQUE INDEX payment_sessions_gateway_payment_id ON payment_sessions (gateway, gateway_payment_id)
    WHERE gateway_payment_id IS NOT NULL;
-- The sweeper's fetch: due active sessions.
CREATE INDEX payment_sessions_due ON payment_sessions (next_check_at)
    WHERE status IN ('Registering', 'Registered', 'Unknown', 'Authorized', 'Canceling');
CREATE INDEX payment_sessions_order ON payment_sessions (order_id, created_at);
CREATE INDEX payment_sessions_status ON payment_sessions (status);

-- Append-only timeline: every status change, with who and why, written in the same transaction.
CREATE TABLE session_events (
    id          bigserial PRIMARY KEY,
    session_id  uuid NOT NULL REFERENCES payment_sessions (id),
    from_status text,
    to_status   text NOT NULL,
    actor_kind  text NOT NULL,
    actor_id    text NOT NULL DEFAULT '',
    reason      text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL
);
CREATE INDEX session_events_session ON session_events (session_id, id);

-- Every call to the gateway: what, with which idempotency key, how it ended, how long it took.
CREATE TABLE gateway_calls (
    id              bigserial PRIMARY KEY,
    session_id      uuid REFERENCES payment_sessions (id),
    operation       text NOT NULL,
    idempotency_key text,
    outcome         text NOT NULL CHECK (outcome IN ('ok', 'definitive', 'unknown', 'not_sent')),
    http_status     integer,
    latency_ms      integer NOT NULL,
    detail          text NOT NULL DEFAULT '',
    replica_id      text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL
);
CREATE INDEX gateway_calls_session ON gateway_calls (session_id, id);

-- The ledger. Money state changes write here in the same transaction as the status change.
CREATE TABLE accounting_entries (
    id         bigserial PRIMARY KEY,
    order_id   text NOT NULL REFERENCES orders (order_id),
    session_id uuid NOT NULL REFERENCES payment_sessions (id),
    entry_type text NOT NULL CHECK (entry_type IN ('PaymentReceived', 'RefundIssued')),
    amount     bigint NOT NULL,
    currency   text NOT NULL,
    created_at timestamptz NOT NULL
);
-- The last line of defence for "exactly one PaymentReceived per order".
CREATE UNIQUE INDEX accounting_entries_one_payment_received ON accounting_entries (order_id)
    WHERE entry_type = 'PaymentReceived';

-- Cases for finance: whatever the gateway said that contradicts what we already concluded
-- (a late success for a Failed/Canceled session, an unrequested reversal), and sessions whose
-- sweep schedule ran out. One open case per session and kind.
CREATE TABLE finance_cases (
    id          bigserial PRIMARY KEY,
    session_id  uuid REFERENCES payment_sessions (id),
    order_id    text REFERENCES orders (order_id),
    kind        text NOT NULL,
    detail      text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    resolved_at timestamptz,
    resolved_by text,
    resolution  text
);
CREATE UNIQUE INDEX finance_cases_one_open ON finance_cases (session_id, kind) WHERE resolved_at IS NULL;

-- One-time cancel codes: only a keyed hash is stored; attempts move in the same UPDATE that checks.
CREATE TABLE cancel_challenges (
    id           uuid PRIMARY KEY,
    session_id   uuid NOT NULL REFERENCES payment_sessions (id),
    code_hash    bytea NOT NULL,
    expires_at   timestamptz NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    consumed_at  timestamptz,
    requested_by text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL
);
CREATE INDEX cancel_challenges_session ON cancel_challenges (session_id);

-- The reverse (void) of a session at the gateway. Its id is the gateway idempotency key; UNIQUE
-- (session_id) makes "one reverse per session" a schema fact.
CREATE TABLE reverse_operations (
    id           uuid PRIMARY KEY,
    session_id   uuid NOT NULL UNIQUE REFERENCES payment_sessions (id),
    challenge_id uuid REFERENCES cancel_challenges (id),
    status       text NOT NULL CHECK (status IN ('Pending', 'Succeeded', 'Refused')),
    detail       text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);

-- Messages to customers (one-time codes, …). Always written; also POSTed to NOTIFY_WEBHOOK_URL
-- when that is set.
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    kind         text NOT NULL,
    to_addr      text NOT NULL,
    body         text NOT NULL,
    order_id     text,
    payment_id   uuid,
    created_at   timestamptz NOT NULL,
    delivered_at timestamptz,
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text
);

-- +goose Down
DROP TABLE outbox, reverse_operations, cancel_challenges, finance_cases, accounting_entries,
    gateway_calls, session_events, payment_sessions, orders;
