-- +goose Up
-- Who typed each wrong one-time code (payments.tryCode: "staff:<email>", "api:<client>"), so an
-- unlock (payments.UnlockCodes) is refused to a person who typed some of the wrong codes it
-- would clear: the one who types the codes in does not reset their own budget — support cannot
-- unlock at all, and an admin, who may do both, cannot unlock their own guesses. Rows of a
-- replica of the release before carry no name (NULL) and stop no one.
ALTER TABLE code_wrong_guesses ADD COLUMN guessed_by text;

-- +goose Down
ALTER TABLE code_wrong_guesses DROP COLUMN guessed_by;
