-- A NaN metric point is stored, as a point whose value is NULL (SQLite cannot hold NaN in a
-- REAL column: it reads back as NULL, so both backends spell it the same way). Aggregates
-- skip NULL, so a NaN never becomes a series' minimum or maximum; the rollups and the
-- series' latest value are computed from the finite points only (`store/ingest.rs`). The
-- partial index finds a series' NaN points (for the charts' gap marks and
-- `metrics.<key> IS NAN`) without reading the others. SQLite cannot drop a NOT NULL
-- constraint, so the table is rebuilt (nothing references it).

CREATE TABLE metric_points_nullable (
    series_id INTEGER NOT NULL REFERENCES metric_series(id) ON DELETE CASCADE,
    step      BIGINT NOT NULL,
    value     REAL NULL,
    time      BIGINT NOT NULL,
    seq       BIGINT NOT NULL,
    PRIMARY KEY (series_id, step)
) WITHOUT ROWID;

INSERT INTO metric_points_nullable (series_id, step, value, time, seq)
SELECT series_id, step, value, time, seq FROM metric_points;

DROP TABLE metric_points;
ALTER TABLE metric_points_nullable RENAME TO metric_points;

CREATE INDEX metric_points_nan_idx ON metric_points (series_id, step) WHERE value IS NULL;
