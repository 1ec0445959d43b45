-- +goose Up
-- Which run of the order's checkout price a link was made in (payments/checkout_link.go): a link
-- for another amount or currency replaces the order's earlier links, and a price change moves
-- the generation on; a link carries the generation it was made in, signed with it (checkout-link
-- v3). The price row held only the newest amount, so after 100 → 150 → 100 the link at the first
-- 100 — replaced, "pays nothing from then on" (docs/api.md) — paid again for the rest of its own
-- 7 days, past the shop's new one-minute link (a review of the checkout). Links made before this
-- column (v2, no generation) count as generation 0, which every row has until its price changes:
-- they stand while the price they were made at does, as before. A replica of the release before
-- re-prices without moving it during a rolling deploy: its links' earlier runs stand, as before.
ALTER TABLE checkout_prices ADD COLUMN generation bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE checkout_prices DROP COLUMN generation;
