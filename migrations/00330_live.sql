-- +goose Up
-- Live console (issue 13): every change a console page shows sends one NOTIFY on the channel
-- pitlane_live, and each replica's listener (package live) fans it out to the browsers that
-- look at it (server-sent events). Triggers rather than NOTIFY calls in Go: every writer is
-- covered, the one transition function and also whatever else touches a row (the sweeper's
-- leases and flags, "retry now", a refund drive, the finance workbench's claims, a migration
-- fixing data by hand), and a rolled-back transaction notifies nobody because PostgreSQL
-- delivers notifications only at commit.
--
-- One channel, a small JSON payload: {"k": kind, "id": session id (a patrol's: its replica),
-- "o": order id, "s": the session's status (kind "session" only)}. The kinds are live.Kind; the pages each kind
-- refreshes are live's pageKinds table. Identical payloads within one transaction are delivered
-- once (PostgreSQL folds them), so a transaction that touches a session twice without changing
-- its status notifies once.
--
-- Cost: one pg_notify per changed row, queued at commit (PostgreSQL serialises the commits of
-- notifying transactions on a short lock of the notification queue). Rows are small and the
-- payload names ids only; nothing is notified when an UPDATE changes nothing.

-- +goose StatementBegin
CREATE FUNCTION live_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- TG_ARGV[0]: the kind; TG_ARGV[1]: the column holding the session id.
    r jsonb;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := to_jsonb(OLD);
    ELSE
        r := to_jsonb(NEW);
    END IF;
    PERFORM pg_notify('pitlane_live', json_strip_nulls(json_build_object(
        'k', TG_ARGV[0],
        'id', r ->> TG_ARGV[1],
        'o', r ->> 'order_id',
        's', CASE WHEN TG_ARGV[0] = 'session' THEN r ->> 'status' END))::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- payment_sessions: status, leases, flags, the patrol's schedule (payment page, lists,
-- dashboard, locks page, workbench). An UPDATE that rewrites a row unchanged notifies nobody.
CREATE TRIGGER payment_sessions_live AFTER INSERT ON payment_sessions
    FOR EACH ROW EXECUTE FUNCTION live_notify('session', 'id');
CREATE TRIGGER payment_sessions_live_update AFTER UPDATE ON payment_sessions
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION live_notify('session', 'id');
-- gateway_calls are written outside the transactions (a call happened even if what follows
-- rolls back): the payment page's call log and the workbench's "last gateway answer".
CREATE TRIGGER gateway_calls_live AFTER INSERT ON gateway_calls
    FOR EACH ROW WHEN (NEW.session_id IS NOT NULL) EXECUTE FUNCTION live_notify('call', 'session_id');
-- The cancel's state on the payment page: codes requested, tried, consumed; the reverse.
CREATE TRIGGER cancel_challenges_live AFTER INSERT OR UPDATE ON cancel_challenges
    FOR EACH ROW EXECUTE FUNCTION live_notify('cancel', 'session_id');
CREATE TRIGGER reverse_operations_live AFTER INSERT OR UPDATE ON reverse_operations
    FOR EACH ROW EXECUTE FUNCTION live_notify('cancel', 'session_id');
CREATE TRIGGER refunds_live AFTER INSERT OR UPDATE ON refunds
    FOR EACH ROW EXECUTE FUNCTION live_notify('refund', 'session_id');
-- Finance: cases, four-eyes proposals, the ledger, "Check now" claims.
CREATE TRIGGER finance_cases_live AFTER INSERT OR UPDATE ON finance_cases
    FOR EACH ROW EXECUTE FUNCTION live_notify('case', 'session_id');
CREATE TRIGGER resolution_proposals_live AFTER INSERT OR UPDATE ON resolution_proposals
    FOR EACH ROW EXECUTE FUNCTION live_notify('resolution', 'session_id');
CREATE TRIGGER accounting_entries_live AFTER INSERT ON accounting_entries
    FOR EACH ROW EXECUTE FUNCTION live_notify('ledger', 'session_id');
CREATE TRIGGER finance_check_claims_live AFTER INSERT OR UPDATE ON finance_check_claims
    FOR EACH ROW EXECUTE FUNCTION live_notify('claim', 'session_id');
-- The dashboard's patrol line per replica: a replica arriving or leaving, its first look, its
-- sessions in flight, a back-off. Not its beat and last-look times, which move every round
-- (SWEEP_INTERVAL): that would make every dashboard fetch itself every round, polling by
-- another name; the line's "last look … ago" is as of the dashboard's last refresh.
CREATE TRIGGER sweeper_heartbeats_live AFTER INSERT OR DELETE ON sweeper_heartbeats
    FOR EACH ROW EXECUTE FUNCTION live_notify('patrol', 'replica_id');
CREATE TRIGGER sweeper_heartbeats_live_update AFTER UPDATE ON sweeper_heartbeats
    FOR EACH ROW WHEN ((OLD.in_flight, OLD.backoff_until, OLD.backoff_reason, OLD.version, OLD.started_at, OLD.last_sweep_at IS NULL)
        IS DISTINCT FROM (NEW.in_flight, NEW.backoff_until, NEW.backoff_reason, NEW.version, NEW.started_at, NEW.last_sweep_at IS NULL))
    EXECUTE FUNCTION live_notify('patrol', 'replica_id');

-- +goose Down
DROP TRIGGER sweeper_heartbeats_live_update ON sweeper_heartbeats;
DROP TRIGGER sweeper_heartbeats_live ON sweeper_heartbeats;
DROP TRIGGER finance_check_claims_live ON finance_check_claims;
DROP TRIGGER accounting_entries_live ON accounting_entries;
DROP TRIGGER resolution_proposals_live ON resolution_proposals;
DROP TRIGGER finance_cases_live ON finance_cases;
DROP TRIGGER refunds_live ON refunds;
DROP TRIGGER reverse_operations_live ON reverse_operations;
DROP TRIGGER cancel_challenges_live ON cancel_challenges;
DROP TRIGGER gateway_calls_live ON gateway_calls;
DROP TRIGGER payment_sessions_live_update ON payment_sessions;
DROP TRIGGER payment_sessions_live ON payment_sessions;
DROP FUNCTION live_notify();
