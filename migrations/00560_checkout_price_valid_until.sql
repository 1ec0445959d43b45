-- +goose Up
-- Until when the order's checkout price may be paid without a link in hand
-- (payments/checkout_link.go, CheckoutRetry): the latest expiry among the links made for the
-- order at its current amount and currency. The order's page token (?view=…) never expires, and
-- its "Try again" after a decline retried the last payment's amount with no clock at all, so a
-- return URL found in a browser history months after the link's 410 still started a payment (an
-- outside review). The page's retry is now bounded by this column. Nullable, no backfill: a row
-- written before this column (or inserted by a replica of the release before, during a rolling
-- deploy) reads as priced_at + 30 days, the longest any link could have lived
-- (MaxCheckoutLinkTTL). A row an old replica re-prices during the rollout keeps the previous
-- price's time until a new replica makes a link: still bounded, by at most that link's 30 days.
ALTER TABLE checkout_prices ADD COLUMN valid_until timestamptz;

-- +goose Down
ALTER TABLE checkout_prices DROP COLUMN valid_until;
