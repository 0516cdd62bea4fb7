-- What the MLflow tracking protocol needs beyond the native model: soft deletion of runs and
-- experiments, experiment tags, dataset inputs, and numeric experiment ids ("0" is Default).

ALTER TABLE experiments ADD COLUMN deleted_at BIGINT NULL;
ALTER TABLE experiments ADD COLUMN updated_at BIGINT NULL;
ALTER TABLE runs ADD COLUMN deleted_at BIGINT NULL;
CREATE INDEX runs_deleted_idx ON runs (deleted_at);

CREATE TABLE experiment_tags (
    experiment_id TEXT NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
    key           TEXT NOT NULL,
    value         TEXT NOT NULL,
    PRIMARY KEY (experiment_id, key)
);

-- A dataset a run used (MLflow's `log-inputs`): the input as the client sent it, once per
-- (run, dataset name, digest).
CREATE TABLE run_inputs (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name   TEXT NOT NULL,
    digest TEXT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, name, digest)
);

-- Named counters; `experiment` is the last experiment id handed out.
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);

-- Experiments made before this migration had 32-hex ids: they become 1, 2, ... in creation
-- order (runs and grants follow), so every experiment id is a number as MLflow clients expect.
CREATE TABLE experiment_renumber (
    old_id TEXT PRIMARY KEY,
    new_id TEXT NOT NULL,
    name   TEXT NOT NULL
);
INSERT INTO experiment_renumber (old_id, new_id, name)
    SELECT id, CAST(ROW_NUMBER() OVER (ORDER BY created_at, id) AS TEXT), name
    FROM experiments WHERE id <> '0';
INSERT INTO experiments (id, name, created_at, owner_id, default_level)
    SELECT m.new_id, '~renumbered~' || m.new_id, e.created_at, e.owner_id, e.default_level
    FROM experiment_renumber m JOIN experiments e ON e.id = m.old_id;
UPDATE runs SET experiment_id =
    (SELECT m.new_id FROM experiment_renumber m WHERE m.old_id = runs.experiment_id)
    WHERE experiment_id IN (SELECT old_id FROM experiment_renumber);
UPDATE experiment_grants SET experiment_id =
    (SELECT m.new_id FROM experiment_renumber m WHERE m.old_id = experiment_grants.experiment_id)
    WHERE experiment_id IN (SELECT old_id FROM experiment_renumber);
DELETE FROM experiments WHERE id IN (SELECT old_id FROM experiment_renumber);
UPDATE experiments SET name =
    (SELECT m.name FROM experiment_renumber m WHERE m.new_id = experiments.id)
    WHERE id IN (SELECT new_id FROM experiment_renumber);
INSERT INTO counters (name, value)
    SELECT 'experiment', COUNT(*) FROM experiment_renumber;
DROP TABLE experiment_renumber;
