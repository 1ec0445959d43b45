-- +goose Up
-- A payment whose one-time codes are locked (CodeGuessesPerDay wrong guesses within a day,
-- 00005) is unlocked by a finance or admin user (contract: "then 429, and a staff member must
-- act"; payments.UnlockCodes): the guesses that counted are marked cleared — kept, with who
-- cleared them, for the record — and count no more.
ALTER TABLE code_wrong_guesses ADD COLUMN cleared_at timestamptz, ADD COLUMN cleared_by text;

-- +goose Down
ALTER TABLE code_wrong_guesses DROP COLUMN cleared_by, DROP COLUMN cleared_at;
