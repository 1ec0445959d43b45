-- +goose Up
-- A contradiction finance has resolved is not opened again while it stays the same (docs/console.md).
-- That was judged by a case's exact wording, so the same late payment reported first by its
-- webhook or a Check (worded by Check) came back as a new case at reconciliation's next pass, and
-- reconciliation's own flagged findings (a payment the gateway lost, an amount that differs) came
-- back every pass (an outside review). Each case now keeps the facts it is about, worded the same
-- by every path — a gateway payment as "id (status, amount currency)", a missing one, the set of
-- payments carrying one reference (payments/check.go: gatewayFact) — and news whose every fact is in a
-- resolved case of the session and kind opens nothing.
ALTER TABLE finance_cases ADD COLUMN facts text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE finance_cases DROP COLUMN facts;
