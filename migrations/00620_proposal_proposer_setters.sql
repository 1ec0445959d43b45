-- +goose Up
-- The second-person rule of four-eyes approval is about who MADE a proposal: an admin who set a
-- user's password (password_set_by, 00490) could be that user when the proposal was made. It was
-- judged only at approval, on the passwords as they are then: once the user's password was reset
-- (by another admin, or from the command line, as the refusal's own message advised), the admin
-- who had made the proposal as that user approved it as themselves (an outside review). Each
-- proposal now keeps the chain of the proposer's password setters as it was when it was made
-- (payments/resolution.go: the approval's guard refuses anyone in it). Filled by a trigger, so
-- every kind of proposal and a replica of the release before get it too.
ALTER TABLE resolution_proposals ADD COLUMN proposer_setters text[] NOT NULL DEFAULT '{}';

-- password_setters(a): who set a's password, and who set theirs, … (the upward walk of
-- password_linked).
-- +goose StatementBegin
CREATE FUNCTION password_setters(a text) RETURNS text[] LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up(email) AS (
        SELECT password_set_by FROM staff_users WHERE email = a AND password_set_by IS NOT NULL
        UNION
        SELECT u.password_set_by FROM staff_users u JOIN up ON u.email = up.email WHERE u.password_set_by IS NOT NULL)
    SELECT coalesce(array_agg(email), '{}') FROM up
$$;

CREATE FUNCTION resolution_proposals_setters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.proposer_setters := password_setters(NEW.proposed_by);
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER resolution_proposals_setters BEFORE INSERT ON resolution_proposals
    FOR EACH ROW EXECUTE FUNCTION resolution_proposals_setters();

-- Proposals waiting now: their proposers' setters as they are (the best knowledge there is).
UPDATE resolution_proposals SET proposer_setters = password_setters(proposed_by) WHERE state = 'proposed';

-- +goose Down
DROP TRIGGER resolution_proposals_setters ON resolution_proposals;
DROP FUNCTION resolution_proposals_setters();
DROP FUNCTION password_setters(text);
ALTER TABLE resolution_proposals DROP COLUMN proposer_setters;
