-- +goose Up
-- Which request holds a checkout intent (payments/checkout_intent.go, CheckoutPay): a fresh
-- token per acquire of the key (the click's first request, or a retry that takes a stale click
-- over), which the holder's bind and release must name. Without it a request that lost its hold
-- (slower than the stale time, its click taken over by a retry) still bound the key to its own
-- session over the retry's, or let go of the key the retry held, letting a third request in.
-- NULL when nobody holds the key (bound, released, or acquired by a replica of the release
-- before). Nullable, no backfill, so a rolling deploy works: a replica of the release before
-- neither sets nor checks it (its bind and release go by the key alone, as they did), and a new
-- replica binds or releases only a key it acquired itself, under its own token.
ALTER TABLE checkout_intents ADD COLUMN lock_token uuid;

-- +goose Down
ALTER TABLE checkout_intents DROP COLUMN lock_token;
