-- +goose Up
-- One-time code limits (contract: "one-time code limits"; payments/cancel.go).

-- A new code replaces the earlier ones of its payment: they are marked superseded in the
-- transaction that makes the new one, and answer 410 from then on.
ALTER TABLE cancel_challenges ADD COLUMN superseded_at timestamptz;
-- Code requests per payment per hour are counted from the challenges themselves, under the
-- order → session locks; this index serves that count.
CREATE INDEX cancel_challenges_session_created ON cancel_challenges (session_id, created_at);

-- Wrong guesses per payment per 24 hours, across all its codes: one row per wrong guess, counted
-- and written in one transaction under the order → session locks, so every replica spends the
-- same budget and two concurrent guesses cannot both take its last unit.
CREATE TABLE code_wrong_guesses (
    id           bigserial PRIMARY KEY,
    session_id   uuid NOT NULL REFERENCES payment_sessions (id),
    challenge_id uuid NOT NULL REFERENCES cancel_challenges (id),
    created_at   timestamptz NOT NULL
);
CREATE INDEX code_wrong_guesses_session ON code_wrong_guesses (session_id, created_at);

-- The outbox keeps a message's text with its secret (a one-time code) only until it is delivered;
-- then body becomes this redacted text. NULL: the message holds nothing secret.
ALTER TABLE outbox ADD COLUMN redacted_body text;

-- +goose Down
ALTER TABLE outbox DROP COLUMN redacted_body;
DROP TABLE code_wrong_guesses;
DROP INDEX cancel_challenges_session_created;
ALTER TABLE cancel_challenges DROP COLUMN superseded_at;
