-- +goose Up
-- Device cookies (access/devices.go; OWASP's answer to sign-in lockouts): a browser that signed
-- in to an account gets a random token, kept here as its SHA-256 only. Its later sign-ins to
-- that account skip the address and global throttle buckets (which a botnet or one IPv6 /56 can
-- fill, refusing every sign-in in the world) and the account's lock (which five guesses set);
-- after as many wrong passwords as lock an account, the device is trusted no more. Rows unused
-- for 90 days are reaped with the throttle's.
CREATE TABLE staff_devices (
    token_hash   bytea PRIMARY KEY,
    email        text NOT NULL,
    failures     integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL,
    last_used_at timestamptz NOT NULL
);
CREATE INDEX staff_devices_last_used ON staff_devices (last_used_at);

-- +goose Down
DROP TABLE staff_devices;
