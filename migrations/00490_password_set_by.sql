-- +goose Up
-- Who knows a staff user's password besides its owner: the console user (an admin) who set it,
-- when creating the user or replacing its password. NULL when it was set from the command line
-- (an operator on the server, outside the console's roles). The second-person rules (four-eyes
-- approval, "whoever reads a code does not confirm it") treat an account and the one who set its
-- password as the same person: otherwise one admin could reset another user's password, sign
-- in as them and approve their own proposal, or confirm a code they read in the outbox.
ALTER TABLE staff_users ADD COLUMN password_set_by text;

-- +goose Down
ALTER TABLE staff_users DROP COLUMN password_set_by;
