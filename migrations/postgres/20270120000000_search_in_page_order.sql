-- A run search reads one index in page order and stops after the page (docs/search.md):
-- each sort group's statement orders by exactly the columns of one of these, with the run id
-- last, so the keyset cursor is a range of the index and no plan needs statistics to be fast.
-- The latest metric values and the params carry their run's experiment (a run never changes
-- experiment), so a sort within one experiment walks that experiment's entries only.

ALTER TABLE metric_series ADD COLUMN experiment_id TEXT;
UPDATE metric_series s SET experiment_id = r.experiment_id FROM runs r WHERE r.id = s.run_id;
ALTER TABLE metric_series ALTER COLUMN experiment_id SET NOT NULL;

ALTER TABLE run_params ADD COLUMN experiment_id TEXT;
UPDATE run_params p SET experiment_id = r.experiment_id FROM runs r WHERE r.id = p.run_id;
ALTER TABLE run_params ALTER COLUMN experiment_id SET NOT NULL;

-- Sort by a metric: the runs having the key, by latest value, then run id; across experiments
-- and within one.
DROP INDEX metric_series_key_idx;
CREATE INDEX metric_series_key_idx ON metric_series (key, last_value, run_id);
CREATE INDEX metric_series_experiment_idx
    ON metric_series (experiment_id, key, last_value, run_id);

-- Sort by a param: numeric values by (number, text, run), then text values by (text, run).
DROP INDEX run_params_key_idx;
CREATE INDEX run_params_key_idx ON run_params (key, num, value COLLATE "C", run_id);
CREATE INDEX run_params_text_idx ON run_params (key, value COLLATE "C", run_id)
    WHERE num IS NULL;
CREATE INDEX run_params_experiment_idx
    ON run_params (experiment_id, key, num, value COLLATE "C", run_id);
CREATE INDEX run_params_experiment_text_idx
    ON run_params (experiment_id, key, value COLLATE "C", run_id) WHERE num IS NULL;

-- The sorts of the runs themselves within one experiment, and the runs lacking a sort key,
-- in id order.
CREATE INDEX runs_experiment_id_idx ON runs (experiment_id, id);
CREATE INDEX runs_experiment_name_idx ON runs (experiment_id, name COLLATE "C", id);
CREATE INDEX runs_experiment_status_idx ON runs (experiment_id, status COLLATE "C", id);

-- A tag filter is a probe of the run's (run_id, key) key. Beside this index, which nothing
-- reads, a planner without statistics priced both alike and walked every run's matching tags
-- per run instead.
DROP INDEX run_tags_key_idx;
