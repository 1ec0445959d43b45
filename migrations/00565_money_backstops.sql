-- +goose NO TRANSACTION
-- +goose Up
-- Three money rules the core holds under its order → session locks, held by the schema too, so
-- a path that one day writes without those locks (a data fix, a bulk tool, a bug) fails instead
-- of moving money (an outside review found each resting on the locks alone):
--   - refunds of a payment never exceed what it received (the trigger locks the session row,
--     which every refund path holds already, and sums again);
--   - a RefundIssued ledger entry always names its refund (the one-entry-per-refund index skips a
--     NULL refund_id), and a PaymentReceived entry never does;
--   - a payment in a final state (Completed, Failed, Canceled) never changes status again.
-- SQLSTATE PT500 (migration 00440): an invariant would break. No statement of the core reaches
-- these guards; they are backstops.
-- NO TRANSACTION: the ledger's check is added NOT VALID (a brief lock) and validated in a
-- statement of its own, which reads the ledger without blocking writers.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pitlane_refund_within_payment() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s_amount bigint;
    taken    bigint;
BEGIN
    SELECT amount INTO s_amount FROM payment_sessions WHERE id = NEW.session_id FOR UPDATE;
    SELECT coalesce(sum(amount), 0) INTO taken FROM refunds
        WHERE session_id = NEW.session_id AND status <> 'Failed' AND id <> NEW.id;
    IF taken + NEW.amount > s_amount THEN
        RAISE EXCEPTION 'refund %: % refunded or pending plus % would exceed the % received by payment % (invariant)',
            NEW.id, taken, NEW.amount, s_amount, NEW.session_id USING ERRCODE = 'PT500';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS refunds_within_payment ON refunds;

CREATE TRIGGER refunds_within_payment BEFORE INSERT OR UPDATE OF amount, session_id ON refunds
    FOR EACH ROW WHEN (NEW.status <> 'Failed') EXECUTE FUNCTION pitlane_refund_within_payment();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pitlane_final_status_stays() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payment %: % is final, it cannot become % (invariant)', OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'PT500';
END
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS payment_sessions_final_status ON payment_sessions;

-- The WHEN clause is evaluated without calling the function: an update of an active payment
-- costs one comparison.
CREATE TRIGGER payment_sessions_final_status BEFORE UPDATE OF status ON payment_sessions
    FOR EACH ROW WHEN (OLD.status IN ('Completed', 'Failed', 'Canceled') AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION pitlane_final_status_stays();

ALTER TABLE accounting_entries DROP CONSTRAINT IF EXISTS accounting_entries_refund_names_its_refund;

ALTER TABLE accounting_entries ADD CONSTRAINT accounting_entries_refund_names_its_refund
    CHECK ((entry_type = 'RefundIssued') = (refund_id IS NOT NULL)) NOT VALID;

ALTER TABLE accounting_entries VALIDATE CONSTRAINT accounting_entries_refund_names_its_refund;

-- +goose Down
ALTER TABLE accounting_entries DROP CONSTRAINT IF EXISTS accounting_entries_refund_names_its_refund;
DROP TRIGGER IF EXISTS payment_sessions_final_status ON payment_sessions;
DROP FUNCTION IF EXISTS pitlane_final_status_stays();
DROP TRIGGER IF EXISTS refunds_within_payment ON refunds;
DROP FUNCTION IF EXISTS pitlane_refund_within_payment();
