-- +goose Up
-- Which run of the order's checkout price a link was made in (payments/checkout_link.go): a link
-- for another amount or currency replaces the order's earlier links, and every change of the
-- price moves its generation on; a link carries the generation it was made in, signed (gen and
-- gsig beside sig). The price row held only the newest amount, so after 100 → 150 → 100 the link
-- at the first 100 — replaced, "pays nothing from then on" (docs/api.md) — paid again for the rest
-- of its own 7 days, past the shop's new one-minute link (a review of the checkout).
--
-- The trigger moves the generation, not the Go code: a replica of the release before (a rolling
-- deploy, a rollback) that re-prices an order moves it too, and the links of the runs before stay
-- replaced. Links made before this column (no gen) are of generation 0, which every row has until
-- its price changes: they stand while the price they were made at does, as before.
ALTER TABLE checkout_prices ADD COLUMN generation bigint NOT NULL DEFAULT 0;

-- +goose StatementBegin
CREATE FUNCTION checkout_price_generation() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER checkout_price_generation BEFORE UPDATE ON checkout_prices
    FOR EACH ROW EXECUTE FUNCTION checkout_price_generation();

-- +goose Down
DROP TRIGGER checkout_price_generation ON checkout_prices;
DROP FUNCTION checkout_price_generation();
ALTER TABLE checkout_prices DROP COLUMN generation;
