-- +goose Up
-- The Operations page's history (issue 13, "pictures"; payments/ops_samples.go,
-- payments/console_charts.go).
--
-- ops_samples: one row per minute, written by whichever replica's patrol comes first in that
-- minute (INSERT … WHERE NOT EXISTS … ON CONFLICT (at) DO NOTHING: the other replicas find the
-- row and count nothing). A row holds what the charts of the last 24 h need and what cannot be
-- read back cheaply later:
--   - the active sessions by state at that moment (a stock: counted over the partial indexes of
--     the active states, never the settled part of payment_sessions);
--   - the sessions settled (Completed, Failed, Canceled) since the previous sample (a flow:
--     counted from session_events over that bounded time range, by session_events_created);
--   - the patrol's backlog at that moment: due sessions no live lease covers, the oldest due
--     look, sessions under a lease, flagged sessions.
-- Why a sample and not the timeline: "how many sessions were in each state at 03:00" replayed
-- from session_events means reading every event of the day (millions at a million sessions a
-- day) on each page view; 1 440 small rows a day cost nothing to read. Rows older than
-- payments.OpsSampleRetention (3 days) are reaped by the patrol's housekeeping.
CREATE TABLE ops_samples (
    at            timestamptz PRIMARY KEY, -- the minute this sample stands for
    taken_at      timestamptz NOT NULL,    -- when the counts were taken (within that minute)
    taken_by      text NOT NULL DEFAULT '',
    registering   integer NOT NULL,
    registered    integer NOT NULL,
    unknown       integer NOT NULL,
    authorized    integer NOT NULL,
    canceling     integer NOT NULL,
    flagged       integer NOT NULL,
    due           integer NOT NULL,
    oldest_due_at timestamptz,
    leased        integer NOT NULL,
    settled_since timestamptz NOT NULL,    -- settled counts cover [settled_since, at)
    completed     integer NOT NULL,
    failed        integer NOT NULL,
    canceled      integer NOT NULL
);

-- +goose Down
DROP TABLE ops_samples;
