-- +goose Up
-- Two guards of the core raise in SQL instead of being checked by the Go caller: a transition
-- that moved no row (the edge is not allowed from the current state, or there is no such
-- payment), and a completion that found no order awaiting payment through its session. A
-- statement's error aborts the transaction, and a COMMIT pipelined behind the statement is then
-- skipped, so an apply can send its COMMIT with its last statement (one round trip less per
-- Create and per settle) without a refused guard ever being committed around.
--
-- SQLSTATEs (class PT, pitlane's own): PT409 the transition is not allowed (the message names the
-- current state), PT404 no such payment, PT500 an invariant is broken.

-- +goose StatementBegin
CREATE FUNCTION pitlane_transition_done(moved bigint, from_status text, to_status text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF moved = 1 THEN
        RETURN true;
    END IF;
    IF from_status IS NULL THEN
        RAISE EXCEPTION 'payment not found' USING ERRCODE = 'PT404';
    END IF;
    RAISE EXCEPTION 'payment cannot go from % to %', from_status, to_status USING ERRCODE = 'PT409';
END
$$;
CREATE FUNCTION pitlane_order_completed(entries bigint, order_id text, session_id uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF entries = 1 THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'complete: order % is not awaiting payment through session % (invariant broken)', order_id, session_id
        USING ERRCODE = 'PT500';
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pitlane_order_completed(bigint, text, uuid);
DROP FUNCTION pitlane_transition_done(bigint, text, text);
