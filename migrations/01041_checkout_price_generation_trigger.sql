-- +goose Up
-- The generation of an order's checkout price (migration 01040) moves in the database, not in the
-- Go code: every change of the amount or currency moves it on, whichever replica writes it — one
-- of the release before (a rolling deploy, a rollback) re-pricing an order moves it too, and the
-- links of the run before stay replaced (a review of the generations). Written so that it may run
-- again (CREATE OR REPLACE, DROP … IF EXISTS): a database that ran an earlier draft of 01040 is
-- brought to the same end.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION checkout_price_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.amount IS DISTINCT FROM OLD.amount OR NEW.currency IS DISTINCT FROM OLD.currency THEN
        NEW.generation := OLD.generation + 1;
    ELSE
        NEW.generation := OLD.generation;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS checkout_price_generation ON checkout_prices;
CREATE TRIGGER checkout_price_generation BEFORE UPDATE ON checkout_prices
    FOR EACH ROW EXECUTE FUNCTION checkout_price_generation();

-- +goose Down
DROP TRIGGER IF EXISTS checkout_price_generation ON checkout_prices;
DROP FUNCTION IF EXISTS checkout_price_generation();
