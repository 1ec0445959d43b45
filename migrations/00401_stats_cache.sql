-- +goose Up
-- stats_cache: the operator's counts (payments.Stats: sessions by status, the sweepers' backlog,
-- open cases, …) as one replica last counted them. Every replica's /metrics is scraped every few
-- seconds; without this each scrape would run the whole-table counts. A scrape that finds the
-- row older than the maximum age claims it with a guarded
-- UPDATE … WHERE refreshed_at <= cutoff (FOR UPDATE SKIP LOCKED: a scrape never waits for
-- another's count), counts, and stores the result in the same transaction; every other scrape,
-- on any replica, reads the stored counts. One row, id 1.
CREATE TABLE stats_cache (
    id           integer PRIMARY KEY CHECK (id = 1),
    refreshed_at timestamptz NOT NULL,
    stats        jsonb NOT NULL
);
INSERT INTO stats_cache (id, refreshed_at, stats) VALUES (1, '-infinity', 'null');

-- +goose Down
DROP TABLE stats_cache;
