-- +goose NO TRANSACTION
-- +goose Up
-- The cases page lists the open cases oldest first, a page at a time, with their count
-- (payments.ListCases): the oldest are the most urgent, and a list cut at its newest 500 hid
-- them after an outage opened more. Open cases are few beside the resolved ones, which grow
-- with every payment finance ever looked at: without this index the oldest-first list walked
-- every resolved case from the first. CONCURRENTLY, outside a transaction, like 00510.
DROP INDEX CONCURRENTLY IF EXISTS finance_cases_open;
CREATE INDEX CONCURRENTLY finance_cases_open ON finance_cases (id) WHERE resolved_at IS NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS finance_cases_open;
