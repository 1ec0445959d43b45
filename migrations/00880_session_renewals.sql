-- +goose Up
-- A signed-in session's renewal (a new password, "sign out everywhere else": web/auth) deletes
-- its old token when it starts and stores the new one when its request answers. A sign-out of
-- the old token in another tab, landing between the two, deleted nothing, and the renewal then
-- stored the new token: the browser could end up signed in after it signed out. Each renewal
-- now leaves its link here (tokens hashed, as in sessions): the sign-out of an old token marks
-- it ended and deletes the session it was renewed into; a renewal whose link was ended stores
-- nothing. Rows live an hour (a renewal's request lasts seconds) and are reaped with sessions.
CREATE TABLE session_renewals (
    old_token text PRIMARY KEY,
    new_token text,
    ended     boolean NOT NULL DEFAULT false,
    expiry    timestamptz NOT NULL
);
CREATE INDEX session_renewals_expiry ON session_renewals (expiry);

-- +goose Down
DROP TABLE session_renewals;
