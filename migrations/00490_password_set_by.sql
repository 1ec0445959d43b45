-- +goose Up
-- Who knows a staff user's password besides its owner: the console user (an admin) who set it,
-- when creating the user or replacing its password. NULL when it was set from the command line
-- (an operator on the server, outside the console's roles). The owner setting their own keeps
-- it: whoever set the password before could be the one at the keyboard. The second-person rules
-- (four-eyes approval, "whoever reads a code does not confirm it") treat two accounts as one
-- person when one reaches the other through a chain of password setters: otherwise one admin
-- could reset another user's password, sign in as them and approve their own proposal, or
-- confirm a code they read in the outbox.
ALTER TABLE staff_users ADD COLUMN password_set_by text;

-- password_linked(a, b): a set b's password, or b set a's, directly or through accounts whose
-- passwords they set (A set B's, and as B set C's: A and C are linked). A short walk up each
-- account's setters: staff_users is small, and UNION stops at a cycle.
-- +goose StatementBegin
CREATE FUNCTION password_linked(a text, b text) RETURNS boolean LANGUAGE sql STABLE AS $$
    WITH RECURSIVE
        up_a(email) AS (
            SELECT password_set_by FROM staff_users WHERE email = a AND password_set_by IS NOT NULL
            UNION
            SELECT u.password_set_by FROM staff_users u JOIN up_a ON u.email = up_a.email WHERE u.password_set_by IS NOT NULL),
        up_b(email) AS (
            SELECT password_set_by FROM staff_users WHERE email = b AND password_set_by IS NOT NULL
            UNION
            SELECT u.password_set_by FROM staff_users u JOIN up_b ON u.email = up_b.email WHERE u.password_set_by IS NOT NULL)
    SELECT a IS DISTINCT FROM b AND (EXISTS (SELECT 1 FROM up_a WHERE email = b) OR EXISTS (SELECT 1 FROM up_b WHERE email = a))
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION password_linked(text, text);
ALTER TABLE staff_users DROP COLUMN password_set_by;
