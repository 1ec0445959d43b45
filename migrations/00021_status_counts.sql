-- +goose Up
-- Sessions per status without counting the table (issue 12). The dashboard shows them every 2 s
-- to every open browser and /metrics exports them: `SELECT status, count(*) … GROUP BY status`
-- reads every row (or every index entry) of payment_sessions, ~100 ms and more at a million
-- sessions, per request.
--
-- A trigger appends a delta row for every session inserted, deleted or moved to another status
-- (-1 for the old status, +1 for the new one) in the same transaction, so the sums are exact
-- at every snapshot. Appending, not updating one counter row per status: a counter row would be
-- a hot row that every Create and every transition locks until commit — all Creates would queue
-- behind each other on it. Appends contend on nothing. Readers sum the deltas
-- (payments.StatusCounts) and fold them into one row per status when many have piled up:
-- DELETE … RETURNING and the INSERT of their sums in one statement, so a fold never loses or
-- counts twice a delta (a concurrent fold waits on the rows this one deletes, then skips them).
CREATE TABLE session_status_deltas (
    id     bigserial PRIMARY KEY,
    status text NOT NULL,
    delta  bigint NOT NULL
);

-- +goose StatementBegin
CREATE FUNCTION payment_sessions_count_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO session_status_deltas (status, delta) VALUES (NEW.status, 1);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO session_status_deltas (status, delta) VALUES (OLD.status, -1);
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO session_status_deltas (status, delta) VALUES (OLD.status, -1), (NEW.status, 1);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The trigger exists before the sums are taken, in this one transaction (CREATE TRIGGER locks
-- out writers until commit), so no session is counted twice or missed.
CREATE TRIGGER payment_sessions_count_status AFTER INSERT OR DELETE OR UPDATE OF status ON payment_sessions
    FOR EACH ROW EXECUTE FUNCTION payment_sessions_count_status();
INSERT INTO session_status_deltas (status, delta) SELECT status, count(*) FROM payment_sessions GROUP BY status;

-- +goose Down
DROP TRIGGER payment_sessions_count_status ON payment_sessions;
DROP FUNCTION payment_sessions_count_status();
DROP TABLE session_status_deltas;
