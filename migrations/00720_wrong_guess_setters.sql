-- +goose Up
-- "Whoever types the codes in does not unlock them" binds people, not accounts: whoever set the
-- guesser's password could have been at that account's keyboard (00490). UnlockCodes judged that
-- link on the passwords as they are at the unlock, so once the guesser's password was reset the
-- admin who had typed ten wrong codes as that account unlocked them as themselves: one person,
-- a second budget of guesses on the payment that day (an outside review; the same gap 00620 and
-- 00630 closed for proposals and codes read in the outbox). Each wrong guess now keeps the chain
-- of its staff guesser's password setters as it is when it is typed (payments/code.go
-- UnlockCodes refuses anyone in it). Filled by a trigger, so a replica of the release before
-- records it too.
ALTER TABLE code_wrong_guesses ADD COLUMN guesser_setters text[] NOT NULL DEFAULT '{}';

-- +goose StatementBegin
CREATE FUNCTION code_wrong_guesses_setters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.guessed_by LIKE 'staff:%' THEN
        NEW.guesser_setters := password_setters(substr(NEW.guessed_by, 7));
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER code_wrong_guesses_setters BEFORE INSERT ON code_wrong_guesses
    FOR EACH ROW EXECUTE FUNCTION code_wrong_guesses_setters();

-- Guesses that may still count: their guessers' setters as they are (the best knowledge there is).
UPDATE code_wrong_guesses SET guesser_setters = password_setters(substr(guessed_by, 7))
    WHERE guessed_by LIKE 'staff:%' AND cleared_at IS NULL;

-- +goose Down
DROP TRIGGER code_wrong_guesses_setters ON code_wrong_guesses;
DROP FUNCTION code_wrong_guesses_setters();
ALTER TABLE code_wrong_guesses DROP COLUMN guesser_setters;
