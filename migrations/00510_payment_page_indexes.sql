-- +goose NO TRANSACTION
-- +goose Up
-- The payment page's lists by payment (payments.PaymentDetail, read again on every live
-- refresh): its ledger entries, its finance cases (closed ones too) and its resolution
-- proposals had no index on the payment. With ~850,000 ledger entries at a million sessions,
-- "this payment's entries, newest first" walked the whole ledger backwards by id; the cases and
-- proposals were read whole. The audit log's actor filter (the audit page) had none either.
-- TestPaymentPageReadsByIndexes fails without them.
--
-- CONCURRENTLY, outside a transaction, like 00351: accounting_entries grows with every payment
-- and refund, and a plain build would stop them for its length. Each index is dropped first, so
-- a build that failed half-way (an INVALID index) is built anew by running `pitlane migrate`
-- again.
DROP INDEX CONCURRENTLY IF EXISTS accounting_entries_session;
CREATE INDEX CONCURRENTLY accounting_entries_session ON accounting_entries (session_id, id);
DROP INDEX CONCURRENTLY IF EXISTS finance_cases_session;
CREATE INDEX CONCURRENTLY finance_cases_session ON finance_cases (session_id, id);
DROP INDEX CONCURRENTLY IF EXISTS resolution_proposals_session;
CREATE INDEX CONCURRENTLY resolution_proposals_session ON resolution_proposals (session_id, proposed_at DESC, id DESC);
DROP INDEX CONCURRENTLY IF EXISTS audit_log_actor;
CREATE INDEX CONCURRENTLY audit_log_actor ON audit_log (actor, id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS audit_log_actor;
DROP INDEX CONCURRENTLY IF EXISTS resolution_proposals_session;
DROP INDEX CONCURRENTLY IF EXISTS finance_cases_session;
DROP INDEX CONCURRENTLY IF EXISTS accounting_entries_session;
