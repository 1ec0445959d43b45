-- +goose Up
-- The payment page's "Codes are locked … until …" (00005's budget of wrong guesses) is read from
-- code_wrong_guesses, which had no live trigger (00330): when finance unlocked the codes
-- (payments.UnlockCodes clears the guesses and writes the audit log, nothing else), support's
-- open page of the payment kept saying "locked" until something else about the payment changed,
-- and support turned the customer away (an outside review).
--
-- Kind "cancel", as the challenges the guesses belong to: the payment page refreshes on it and
-- nothing else does. The payload names the session only (the table has no order_id), so it is
-- the one cancel_challenges sends: a wrong guess's row and its challenge's attempts, written in
-- one transaction, notify once, and so do the up to CodeGuessesPerDay rows an unlock clears
-- (PostgreSQL folds identical payloads of a transaction). Written by people, rarely: the
-- generic live_notify (00430 keeps it for such tables).
CREATE TRIGGER code_wrong_guesses_live AFTER INSERT OR UPDATE ON code_wrong_guesses
    FOR EACH ROW EXECUTE FUNCTION live_notify('cancel', 'session_id');

-- +goose Down
DROP TRIGGER code_wrong_guesses_live ON code_wrong_guesses;
