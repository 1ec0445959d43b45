-- +goose NO TRANSACTION
-- +goose Up
-- Three migrations were edited in place after they were first committed, and goose never runs a
-- recorded version again, so a database migrated between the two commits kept the first
-- version (upgrade review, session 30):
--   00020 (fbbb76b) no longer builds payment_sessions_leased: it made every patrol claim write
--         every index of the table (the 0 ms drain a third slower);
--   00330 (bd1116c) added the sweeper_heartbeats triggers and live_notify's DELETE case: the
--         dashboard's patrol line stayed still;
--   00490 (06aa086) added password_linked(a, b), which every code confirmation and four-eyes
--         approval calls: they failed with "function does not exist".
-- Each statement below brings such a database to what those files say today and changes nothing
-- on one that ran them as they are (every statement may run again: NO TRANSACTION, for the
-- index drop that must not lock the table). TestEditedMigrationsAreRepaired. From now on an
-- applied migration is never edited: released.sha256 holds every file's hash
-- (TestReleasedMigrationsAreNeverEdited).
DROP INDEX CONCURRENTLY IF EXISTS payment_sessions_leased;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION live_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- TG_ARGV[0]: the kind; TG_ARGV[1]: the column holding the session id.
    r jsonb;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := to_jsonb(OLD);
    ELSE
        r := to_jsonb(NEW);
    END IF;
    PERFORM pg_notify('pitlane_live', json_strip_nulls(json_build_object(
        'k', TG_ARGV[0],
        'id', r ->> TG_ARGV[1],
        'o', r ->> 'order_id',
        's', CASE WHEN TG_ARGV[0] = 'session' THEN r ->> 'status' END))::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE OR REPLACE TRIGGER sweeper_heartbeats_live AFTER INSERT OR DELETE ON sweeper_heartbeats
    FOR EACH ROW EXECUTE FUNCTION live_notify('patrol', 'replica_id');
CREATE OR REPLACE TRIGGER sweeper_heartbeats_live_update AFTER UPDATE ON sweeper_heartbeats
    FOR EACH ROW WHEN ((OLD.in_flight, OLD.backoff_until, OLD.backoff_reason, OLD.version, OLD.started_at, OLD.last_sweep_at IS NULL)
        IS DISTINCT FROM (NEW.in_flight, NEW.backoff_until, NEW.backoff_reason, NEW.version, NEW.started_at, NEW.last_sweep_at IS NULL))
    EXECUTE FUNCTION live_notify('patrol', 'replica_id');

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

-- +goose Down
SELECT 1; -- nothing to undo: the objects belong to 00020, 00330 and 00490
