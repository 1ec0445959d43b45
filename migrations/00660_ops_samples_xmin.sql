-- +goose Up
-- The Operations page's settled counts by transaction, not by time (payments/ops_samples.go).
--
-- A sample counted the sessions settled in [previous sample, this minute) by
-- session_events.created_at. But created_at is the time the apply read the clock, before it
-- waited for the order and session locks and committed: a sample that ran in between did not
-- see the row, and the next one counted from its own minute on, after the row's created_at — the
-- settlement was in no sample at all. Ids taken at insert have the same hole (migration 00210).
--
-- So a sample counts as the events feed reads (migration 00210): by the writing transaction's id.
-- settled_xmin is the xmin of the snapshot the sample counted in (pg_snapshot_xmin): every
-- transaction below it has ended, and every one that can still commit a settlement has an id at
-- or above it. A sample counts the settlements with xid in [previous sample's settled_xmin, its
-- own); one still open at a sample is at or above that sample's settled_xmin, so the next sample
-- counts it. Each committed settlement is in exactly one sample while samples follow each other
-- (within payments.opsSampleLookback).
--
-- NULL: a sample written before this migration, or by a replica still running the previous
-- version during a rolling deploy. A sample after one of those (or after a gap longer than the
-- lookback) counts by created_at from settled_since as before, below its own settled_xmin; while
-- old and new replicas take turns, a settlement near a turn can be counted twice or not at all.
--
-- settled_since keeps its meaning as the previous sample's minute (or the minute before, with no
-- previous sample): the counts are the settlements that sample did not see committed and this one
-- did — mostly those of [settled_since, at). Nullable, no default: adding it rewrites nothing.
ALTER TABLE ops_samples ADD COLUMN settled_xmin xid8;

-- +goose Down
ALTER TABLE ops_samples DROP COLUMN settled_xmin;
