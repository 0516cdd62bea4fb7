-- Foreign keys on the two hottest tables cost one referential-integrity trigger per inserted
-- row (about 40% of a 1,000-point batch's insert time). Points and rollups are only ever written
-- by the store, in the same transaction that looks up or creates their series, so the
-- reference cannot dangle; whoever adds series or run deletion must delete their points and
-- rollups explicitly (there is no cascade any more).
ALTER TABLE metric_points DROP CONSTRAINT IF EXISTS metric_points_series_id_fkey;
ALTER TABLE metric_rollups DROP CONSTRAINT IF EXISTS metric_rollups_series_id_fkey;
