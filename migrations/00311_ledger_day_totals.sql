-- +goose Up
-- The ledger page's trial balance without summing the ledger (issue 12, "console at scale"):
-- over a million sessions `SELECT currency, sum(…) FROM accounting_entries GROUP BY currency`
-- read ~850,000 entries on every view (p95 500 ms in make bench). Like the status counts
-- (00021), a trigger appends a delta row per ledger entry in the entry's own transaction — exact
-- at every snapshot, and no hot row for every payment's completion to queue on — keyed by the
-- entry's UTC day, the granularity of the page's date filter. payments.TrialBalance sums the
-- deltas of the filter's days and folds them into one row per day and currency when many have
-- piled up (DELETE … RETURNING and the INSERT of their sums in one statement: a fold never loses
-- or counts twice a delta). Ledger entries are never updated or deleted.
CREATE TABLE ledger_day_deltas (
    id       bigserial PRIMARY KEY,
    day      date NOT NULL,
    currency text NOT NULL,
    received bigint NOT NULL, -- PaymentReceived amounts
    refunded bigint NOT NULL, -- RefundIssued amounts
    entries  bigint NOT NULL
);
CREATE INDEX ledger_day_deltas_day ON ledger_day_deltas (day, currency);

-- +goose StatementBegin
CREATE FUNCTION accounting_entries_day_delta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_day_deltas (day, currency, received, refunded, entries) VALUES (
        (NEW.created_at AT TIME ZONE 'UTC')::date, NEW.currency,
        CASE WHEN NEW.entry_type = 'PaymentReceived' THEN NEW.amount ELSE 0 END,
        CASE WHEN NEW.entry_type = 'RefundIssued' THEN abs(NEW.amount) ELSE 0 END,
        1);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The trigger exists before the existing entries are summed, in this one transaction (CREATE
-- TRIGGER locks out writers until commit): no entry is missed or counted twice.
CREATE TRIGGER accounting_entries_day_delta AFTER INSERT ON accounting_entries
    FOR EACH ROW EXECUTE FUNCTION accounting_entries_day_delta();
INSERT INTO ledger_day_deltas (day, currency, received, refunded, entries)
SELECT (created_at AT TIME ZONE 'UTC')::date, currency,
    coalesce(sum(amount) FILTER (WHERE entry_type = 'PaymentReceived'), 0),
    coalesce(sum(abs(amount)) FILTER (WHERE entry_type = 'RefundIssued'), 0),
    count(*)
FROM accounting_entries GROUP BY 1, 2;

-- +goose Down
DROP TRIGGER accounting_entries_day_delta ON accounting_entries;
DROP FUNCTION accounting_entries_day_delta();
DROP TABLE ledger_day_deltas;
