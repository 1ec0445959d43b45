-- +goose Up
-- Room for HOT updates in the two rows every settle rewrites (issue 10's drain, issue 12's figures).
--
-- A payment session's row is rewritten several times in its life without any indexed column
-- changing: the patrol's claim and release (lease_owner, lease_until, lease_token,
-- check_attempts — none indexed), an attachment of the gateway's URL. An order's row is rewritten
-- when it is paid (status, paid_session_id, active_session_id — none indexed). PostgreSQL
-- writes such an update as a heap-only tuple (HOT: no new entry in any of the table's indexes,
-- eight on payment_sessions) only when the new version fits on the same page. At the default
-- fillfactor of 100 a page is full when written, so every first rewrite of a row moves it to
-- another page and inserts into every index. Leaving a fifth of each new page free makes those
-- rewrites HOT, and lets page pruning reuse the space of dead versions.
--
-- SET (fillfactor) takes a SHARE UPDATE EXCLUSIVE lock only: reads and writes go on during it.
-- Only pages written from now on are affected; existing pages fill as they are rewritten or
-- by a VACUUM FULL / pg_repack an operator chooses to run (docs/operations.md).
ALTER TABLE payment_sessions SET (fillfactor = 80);
ALTER TABLE orders SET (fillfactor = 80);

-- +goose Down
ALTER TABLE orders RESET (fillfactor);
ALTER TABLE payment_sessions RESET (fillfactor);
