-- +goose Up
-- The staff console and the customer checkout (payments/staff*.go, payments/console*.go, web/auth).

-- staff_users: people who sign in to the console. Only a bcrypt hash of the password is kept.
-- Emails are stored lower-cased so that sign-in and uniqueness ignore case.
CREATE TABLE staff_users (
    id            bigserial PRIMARY KEY,
    email         text NOT NULL UNIQUE CHECK (email = lower(email) AND length(email) BETWEEN 3 AND 254),
    role          text NOT NULL CHECK (role IN ('support', 'finance', 'admin')),
    password_hash text NOT NULL,
    created_at    timestamptz NOT NULL,
    disabled_at   timestamptz
);

-- staff_login_throttle: failed sign-ins per email (known or not, so the lockout tells nothing
-- about which emails exist). The row is locked FOR UPDATE while one attempt is judged, so
-- parallel guesses are counted one after another and the sixth never gets a try. In PostgreSQL,
-- not in memory: every replica sees the same count.
CREATE TABLE staff_login_throttle (
    email           text PRIMARY KEY,
    failures        integer NOT NULL DEFAULT 0,
    last_failure_at timestamptz,
    locked_until    timestamptz
);

-- sessions: the table github.com/alexedwards/scs/pgxstore reads and writes (console sign-ins),
-- shared by every replica behind the balancer.
CREATE TABLE sessions (
    token  text PRIMARY KEY,
    data   bytea NOT NULL,
    expiry timestamptz NOT NULL
);
CREATE INDEX sessions_expiry_idx ON sessions (expiry);

-- audit_log: every staff action (and sign-in), append-only. actor is the staff email (or
-- "cli:<user>" for the command line); target names what was acted on (a payment id, "case:12").
CREATE TABLE audit_log (
    id     bigserial PRIMARY KEY,
    at     timestamptz NOT NULL,
    actor  text NOT NULL,
    role   text NOT NULL DEFAULT '',
    action text NOT NULL,
    target text NOT NULL DEFAULT '',
    detail text NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_target ON audit_log (target, id);

-- checkout_intents: one row per Pay click on the checkout page. The page embeds a fresh key in
-- its form; every retry of that click (a double click, a resubmit) carries the same key and so
-- reaches the same payment session. locked_until is held while the click's Create runs (never a
-- database lock across the gateway call); a click whose request died can be taken over after it.
CREATE TABLE checkout_intents (
    key          uuid PRIMARY KEY,
    order_id     text NOT NULL CHECK (order_id ~ '^[A-Za-z0-9._:-]{1,64}$'),
    amount       bigint NOT NULL CHECK (amount > 0 AND amount < 1000000000000),
    currency     text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    session_id   uuid REFERENCES payment_sessions (id),
    locked_until timestamptz,
    created_at   timestamptz NOT NULL
);

-- The locks page names the order behind a create-order advisory lock (key hashtext(order_id))
-- by looking the hash up; without this index that lookup would scan every order.
CREATE INDEX orders_order_id_hashtext ON orders (hashtext(order_id));

-- +goose Down
DROP INDEX orders_order_id_hashtext;
DROP TABLE checkout_intents, audit_log, sessions, staff_login_throttle, staff_users;
