-- +goose Up
-- When an anonymous page (the customer's checkout and return pages) last made the gateway be
-- asked about this session (payments/checkout_look.go). Taken by a guarded UPDATE, so however
-- many replicas serve however many loads, the gateway is asked at most once per interval and
-- nobody on the internet can spend the merchant's gateway rate limit.
ALTER TABLE payment_sessions ADD COLUMN last_gateway_look_at timestamptz;

-- +goose Down
ALTER TABLE payment_sessions DROP COLUMN last_gateway_look_at;
