-- +goose Up
-- "Whoever reads a code in the outbox does not confirm it" binds people, not accounts: whoever set
-- the reader's password could have been the reader (00490). That link was judged at the
-- confirmation, on the passwords as they are then, so once the reader's password was reset the
-- admin who had read the code as that account confirmed it as themselves — the same gap as a
-- four-eyes proposal's (00620, an outside review). The outbox now records, beside each reader, the
-- chain of their password setters as it is when they read (payments/console_ops.go Outbox), and a
-- confirmation by anyone in it is refused (payments/code.go tryCode).
ALTER TABLE cancel_challenges ADD COLUMN seen_by_setters text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE cancel_challenges DROP COLUMN seen_by_setters;
