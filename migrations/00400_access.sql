-- +goose Up
-- Access (package access): what an API key may do, sign-in throttling per client address and
-- overall, and staff sessions that a password change ends.

-- scopes: what a key may call (contract: payments:read, payments:write, refunds:write). Keys made
-- before scopes existed could do everything, so they keep all three; new keys name theirs.
ALTER TABLE api_clients ADD COLUMN scopes text[] NOT NULL
    DEFAULT ARRAY['payments:read', 'payments:write', 'refunds:write']
    CHECK (cardinality(scopes) BETWEEN 1 AND 3
        AND scopes <@ ARRAY['payments:read', 'payments:write', 'refunds:write']);

-- session_epoch: bumped by a password change. A console session remembers the epoch it signed
-- in under and ends when it differs, so a new password throws out whoever knew the old one.
ALTER TABLE staff_users ADD COLUMN session_epoch integer NOT NULL DEFAULT 0;

-- login_buckets: leaky buckets of sign-in attempts, one per client address (IPv6: per /64) and
-- one global row (key ''). An attempt takes a unit before its password is looked at, in one
-- atomic INSERT … ON CONFLICT DO UPDATE … WHERE the bucket has room, so parallel guesses are
-- counted one by one without any lock held across bcrypt; a successful sign-in gives its unit
-- back. level drains continuously (no clock boundary splits a burst). A bucket that has drained
-- empty means nothing and is reaped.
CREATE TABLE login_buckets (
    scope      text NOT NULL CHECK (scope IN ('address', 'global')),
    key        text NOT NULL CHECK (length(key) <= 64),
    level      double precision NOT NULL CHECK (level >= 0),
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX login_buckets_updated_at ON login_buckets (updated_at);

-- staff_login_throttle keeps counting failures per email, known or not (so a lockout says
-- nothing about which emails exist). Rows of unknown emails are bounded by the buckets above
-- (no row is written for a throttled attempt) and reaped once they count for nothing; the
-- reaper's scan needs this index.
CREATE INDEX staff_login_throttle_last_failure ON staff_login_throttle (last_failure_at);

-- +goose Down
DROP INDEX staff_login_throttle_last_failure;
DROP TABLE login_buckets;
ALTER TABLE staff_users DROP COLUMN session_epoch;
ALTER TABLE api_clients DROP COLUMN scopes;
