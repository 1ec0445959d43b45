-- +goose NO TRANSACTION
-- +goose Up
-- pitlane_contact_key (00960) dropped only the white space the database's ctype knows: under C,
-- ASCII alone, so one phone number written with a no-break or thin space (which the API
-- accepts) was a new recipient each time, and a tel: prefix or a / between digits too (a review
-- of it). A contact with no letter and no @ is a phone: its digits and + alone; a tel: prefix is
-- dropped first; anything else is lower case without any Unicode space. A key of '' (a contact
-- of spaces or dashes) names nobody: the code bound skips it (payments/code.go). The index on
-- the function is rebuilt for its new results, CONCURRENTLY: the outbox's writers do not wait.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pitlane_contact_key(contact text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN v !~ '[[:alpha:]@]' THEN regexp_replace(v, '[^0-9+]', '', 'g')
                ELSE lower(regexp_replace(v, '[[:space:]\u00a0\u1680\u180e\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]', '', 'g')) END
    FROM (SELECT regexp_replace(contact, '^[[:space:]\u00a0]*tel:', '', 'i') AS v) AS c
$$;
-- +goose StatementEnd
REINDEX INDEX CONCURRENTLY outbox_code_contact_key;

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pitlane_contact_key(contact text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN contact ~ '^[[:space:]+0-9().-]+$' THEN regexp_replace(contact, '[^0-9+]', '', 'g')
                ELSE lower(regexp_replace(contact, '[[:space:]]', '', 'g')) END
$$;
-- +goose StatementEnd
REINDEX INDEX CONCURRENTLY outbox_code_contact_key;
