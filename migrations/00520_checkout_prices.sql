-- +goose Up
-- The amount and currency an order's newest checkout link asks for (payments/checkout_link.go).
-- A link is only a signature and stays genuine until it expires; without this row every link
-- ever made for an order could pay it, so a customer holding the link from before the shop
-- re-priced the order (or the "try again" of a payment declined at the old price) paid the old
-- amount and the order became Paid. Now a Pay click from the checkout page pays only the
-- order's current checkout price, checked in the claim's transaction under the order's lock;
-- making a link takes the same lock to set it. Links of the same amount and currency stay
-- valid until they expire. The shop's own API Creates are not held to it.
CREATE TABLE checkout_prices (
    order_id  text PRIMARY KEY,
    amount    bigint NOT NULL CHECK (amount > 0),
    currency  text NOT NULL,
    priced_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE checkout_prices;
