-- +goose Up
-- Cases written without facts — before 00740, or during the rolling deploy by a replica of the
-- release before (its INSERT names no facts) — never matched a fact, so a late payment first
-- reported by its webhook or a Check (Check's wording), refunded by hand and resolved, was still
-- reopened by reconciliation's next pass after the upgrade (an outside review of the upgrade).
-- A late_payment case of Check's wording is about the session's own gateway payment, captured
-- (or authorized) for the session's amount: its fact is written so (payments/check.go
-- gatewayFact's form), for the cases there are and, by a trigger, for those an old replica
-- writes. Reconciliation's own cases (their detail names every payment) and other kinds keep no
-- facts: judged by their wording as before.
-- +goose StatementBegin
CREATE FUNCTION finance_case_facts_of(case_kind text, case_detail text, session uuid) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT ARRAY[ps.gateway_payment_id || ' ('
            || CASE WHEN case_detail LIKE 'gateway authorized%' THEN 'authorized' ELSE 'succeeded' END
            || ', ' || ps.amount || ' ' || ps.currency || ')']
        FROM payment_sessions ps
        WHERE ps.id = session AND ps.gateway_payment_id IS NOT NULL
          AND case_kind = 'late_payment' AND case_detail NOT LIKE 'reconciliation:%'), '{}')
$$;

CREATE FUNCTION finance_cases_facts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(NEW.facts) = 0 AND NEW.session_id IS NOT NULL THEN
        NEW.facts := finance_case_facts_of(NEW.kind, NEW.detail, NEW.session_id);
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER finance_cases_facts BEFORE INSERT ON finance_cases
    FOR EACH ROW EXECUTE FUNCTION finance_cases_facts();

UPDATE finance_cases SET facts = finance_case_facts_of(kind, detail, session_id)
    WHERE kind = 'late_payment' AND cardinality(facts) = 0 AND session_id IS NOT NULL;

-- +goose Down
DROP TRIGGER finance_cases_facts ON finance_cases;
DROP FUNCTION finance_cases_facts();
DROP FUNCTION finance_case_facts_of(text, text, uuid);
