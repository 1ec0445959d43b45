-- +goose NO TRANSACTION
-- +goose Up
-- CODE_REQUESTS_PER_CONTACT_PER_HOUR counted a contact by lower(to_addr) (00950): the API keeps
-- customer_contact as given, so " victim@example.com", "victim@example.com " and a phone number
-- written "+1 555 123 4567" or "+1-555-123-4567" were new contacts each, and whoever fed one
-- number to many payments walked round the bound (a review of it). pitlane_contact_key is the
-- contact as one recipient: a phone-like value (digits, spaces, + ( ) . -) by its digits and
-- leading +, anything else lower case without white space. The count and the contact's lock
-- (payments/code.go contactCodesAllowed) both read it; this index serves the count.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pitlane_contact_key(contact text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN contact ~ '^[[:space:]+0-9().-]+$' THEN regexp_replace(contact, '[^0-9+]', '', 'g')
                ELSE lower(regexp_replace(contact, '[[:space:]]', '', 'g')) END
$$;
-- +goose StatementEnd
DROP INDEX CONCURRENTLY IF EXISTS outbox_code_contact_key;
CREATE INDEX CONCURRENTLY outbox_code_contact_key ON outbox (pitlane_contact_key(to_addr), created_at) WHERE challenge_id IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_code_contact;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_code_contact ON outbox (lower(to_addr), created_at) WHERE challenge_id IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_code_contact_key;
DROP FUNCTION IF EXISTS pitlane_contact_key(text);
