-- A NaN metric point is stored, as a point whose value is NULL (SQLite cannot hold NaN in a
-- REAL column, so both backends spell it the same way). Aggregates skip NULL, so a NaN never
-- becomes a series' minimum or maximum; the rollups and the series' latest value are computed
-- from the finite points only (`store/ingest.rs`). The partial index finds a series' NaN
-- points (for the charts' gap marks and `metrics.<key> IS NAN`) without reading the others.

ALTER TABLE metric_points ALTER COLUMN value DROP NOT NULL;
CREATE INDEX metric_points_nan_idx ON metric_points (series_id, step) WHERE value IS NULL;
