-- +goose Up
-- Console sessions are kept under the SHA-256 of their cookie's token (64 hex characters), no
-- longer under the token itself (43 characters): a database copy must not hold credentials one
-- could replay. The sessions stored before are dropped with their clear tokens; their users
-- sign in once more. A replica of the release before, still running during a rolling deploy,
-- writes clear ones again: they are unreadable to the new replicas and expire within the
-- session lifetime (12 h), when the reaper deletes them.
DELETE FROM sessions WHERE length(token) <> 64;

-- +goose Down
-- The release before finds none of the hashed sessions: its users sign in once more.
DELETE FROM sessions;
