-- Tracking store schema (Postgres). Times are unix milliseconds.

CREATE TABLE experiments (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);
INSERT INTO experiments (id, name, created_at) VALUES ('0', 'Default', 0);

CREATE TABLE runs (
    id            TEXT PRIMARY KEY,
    experiment_id TEXT NOT NULL REFERENCES experiments(id),
    name          TEXT NOT NULL,
    status        TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    started_at    BIGINT NULL,
    ended_at      BIGINT NULL,
    config        TEXT NULL,
    notes         TEXT NOT NULL DEFAULT '',
    exit_code     INTEGER NULL,
    exit_signal   INTEGER NULL,
    exit_message  TEXT NULL
);
-- Keyset pagination walks these in (sort value, id) order.
CREATE INDEX runs_created_idx ON runs (created_at, id);
-- Text sorts use code-point order (COLLATE "C"), the same as SQLite.
CREATE INDEX runs_name_idx ON runs (name COLLATE "C", id);
CREATE INDEX runs_status_idx ON runs (status COLLATE "C", id);
CREATE INDEX runs_experiment_idx ON runs (experiment_id, created_at, id);

CREATE TABLE run_tags (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX run_tags_key_idx ON run_tags (key, value);

CREATE TABLE run_params (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    num    DOUBLE PRECISION NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX run_params_key_idx ON run_params (key, num);

-- One row per (run, key); `id` is what points and rollups reference.
CREATE TABLE metric_series (
    id         BIGSERIAL PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key        TEXT NOT NULL,
    count      BIGINT NOT NULL,
    last_step  BIGINT NOT NULL,
    last_value DOUBLE PRECISION NOT NULL,
    last_time  BIGINT NOT NULL,
    UNIQUE (run_id, key)
);
CREATE INDEX metric_series_key_idx ON metric_series (key, last_value);

-- `seq` (a sequence: never reused) orders points for live catch-up.
CREATE TABLE metric_points (
    seq       BIGSERIAL PRIMARY KEY,
    series_id BIGINT NOT NULL REFERENCES metric_series(id) ON DELETE CASCADE,
    step      BIGINT NOT NULL,
    value     DOUBLE PRECISION NOT NULL,
    time      BIGINT NOT NULL,
    UNIQUE (series_id, step)
);

-- Pre-aggregated buckets of 2^level steps, so a chart of a long series reads a few thousand
-- rows instead of every point.
CREATE TABLE metric_rollups (
    series_id BIGINT NOT NULL REFERENCES metric_series(id) ON DELETE CASCADE,
    level     INTEGER NOT NULL,
    bucket    BIGINT NOT NULL,
    count     BIGINT NOT NULL,
    min_step  BIGINT NOT NULL,
    min_value DOUBLE PRECISION NOT NULL,
    min_time  BIGINT NOT NULL,
    max_step  BIGINT NOT NULL,
    max_value DOUBLE PRECISION NOT NULL,
    max_time  BIGINT NOT NULL,
    PRIMARY KEY (series_id, level, bucket)
);

CREATE TABLE run_events (
    seq         BIGSERIAL PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    time        BIGINT NOT NULL,
    from_status TEXT NULL,
    to_status   TEXT NOT NULL,
    reason      TEXT NULL
);
CREATE INDEX run_events_run_idx ON run_events (run_id, seq);
