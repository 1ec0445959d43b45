-- +goose Up
-- A gateway_mismatch case about a stranger's payment (a registration answer carrying another
-- reference, never attached) names it as a foreign fact now, "foreign gp_x (status, amount
-- CUR)" (payments/check.go foreignFact), so that settling the session Failed never takes it for
-- the session's own money (heldBySession). Cases written before say "gp_x (…)": rewritten here,
-- open and resolved alike, or the same stranger's answer after the upgrade would be news to a
-- case finance resolved (the order back in review), and an open one settled Failed would make
-- the stranger's payment this order's late payment (a review). A fact is a stranger's when the
-- case's detail says so in the words the code wrote it with: "the gateway's payment gp_x
-- (status) carries reference …". finance_cases is small (cases only); no rewrite of other rows.
UPDATE finance_cases fc SET facts = ARRAY(
    SELECT CASE WHEN f NOT LIKE 'foreign %' AND strpos(fc.detail, 'the gateway''s payment ' || split_part(f, ' (', 1) || ' ('
            || split_part(split_part(f, ' (', 2), ',', 1) || ') carries reference ') > 0
        THEN 'foreign ' || f ELSE f END
    FROM unnest(fc.facts) f ORDER BY 1)
WHERE fc.kind = 'gateway_mismatch' AND fc.detail LIKE '%) carries reference %';

-- +goose Down
UPDATE finance_cases SET facts = ARRAY(
    SELECT CASE WHEN f LIKE 'foreign %' THEN substr(f, 9) ELSE f END FROM unnest(facts) f ORDER BY 1)
WHERE kind = 'gateway_mismatch' AND EXISTS (SELECT 1 FROM unnest(facts) f WHERE f LIKE 'foreign %');
