-- +goose Up
-- "An account and whoever set its password are one person" (00490) walked each account's chain
-- of setters as the passwords are NOW. Admin X creates admin B (X knows B's password), signs in
-- as B and creates finance user D (X knows D's password too); another admin resets B's password
-- (a routine reset): D's chain became D <- B <- that admin, and X, who still knows D's password,
-- was no longer linked to D: X proposed a refund over the direct limit and approved it as D (an
-- outside review). Who knows a password is decided when it is set: the setter and everyone who
-- knew the setter's own password at that moment. Each account now keeps that set
-- (password_known_by), filled by a trigger whenever its password or its setter changes, so a
-- later reset of an account up the chain takes nobody out of it. password_setters and
-- password_linked read it; the rows that snapshot them (proposals, codes read, wrong guesses:
-- 00620, 00630, 00720) get it through password_setters. A password whose setter stays (its
-- owner replacing it: whoever was at that keyboard may still be; or the same admin again) keeps
-- whoever knew the old one beside the setter's chain now: a link is only ever refused work,
-- never money moved. Existing rows start from their chain as it is now (what was lost before
-- this release cannot be recovered).
ALTER TABLE staff_users ADD COLUMN password_known_by text[] NOT NULL DEFAULT '{}';
UPDATE staff_users SET password_known_by = password_setters(email) WHERE password_set_by IS NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION staff_users_password_known_by() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.password_set_by IS NULL THEN
        NEW.password_known_by := '{}'; -- set from the command line: no console user knows it
    ELSIF TG_OP = 'UPDATE' AND NEW.password_set_by = OLD.password_set_by THEN
        NEW.password_known_by := ARRAY(SELECT DISTINCT e FROM unnest(OLD.password_known_by
            || NEW.password_set_by || (SELECT password_known_by FROM staff_users WHERE email = NEW.password_set_by)) e);
    ELSE
        NEW.password_known_by := ARRAY(SELECT DISTINCT e FROM unnest(NEW.password_set_by
            || (SELECT password_known_by FROM staff_users WHERE email = NEW.password_set_by)) e);
    END IF;
    NEW.password_known_by := coalesce(NEW.password_known_by, '{}');
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER staff_users_password_known_by BEFORE INSERT OR UPDATE OF password_hash, password_set_by ON staff_users
    FOR EACH ROW EXECUTE FUNCTION staff_users_password_known_by();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION password_setters(a text) RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT password_known_by FROM staff_users WHERE email = a), '{}')
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION password_linked(a text, b text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT a IS DISTINCT FROM b AND (b = ANY(password_setters(a)) OR a = ANY(password_setters(b)))
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION password_linked(a text, b text) RETURNS boolean LANGUAGE sql STABLE AS $$
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION password_setters(a text) RETURNS text[] LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up(email) AS (
        SELECT password_set_by FROM staff_users WHERE email = a AND password_set_by IS NOT NULL
        UNION
        SELECT u.password_set_by FROM staff_users u JOIN up ON u.email = up.email WHERE u.password_set_by IS NOT NULL)
    SELECT coalesce(array_agg(email), '{}') FROM up
$$;
-- +goose StatementEnd
DROP TRIGGER staff_users_password_known_by ON staff_users;
DROP FUNCTION staff_users_password_known_by();
ALTER TABLE staff_users DROP COLUMN password_known_by;
