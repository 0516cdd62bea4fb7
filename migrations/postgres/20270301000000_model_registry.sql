-- The model registry: registered models (a name, a description, tags; each belongs to an
-- experiment, whose levels say who may read, register and delete it), their numbered versions
-- (each points at what it was made from: a run and a checkpoint directory or artifact path), and
-- aliases naming one version each. Numbers are never reused: `last_version` only grows, so a
-- deleted version 3 stays gone and the next one is 4 (as MLflow's registry does).

CREATE TABLE registered_models (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    experiment_id TEXT NOT NULL REFERENCES experiments(id),
    description   TEXT NOT NULL,
    created_by    TEXT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    last_version  BIGINT NOT NULL
);
CREATE INDEX registered_models_experiment_idx ON registered_models (experiment_id);

CREATE TABLE registered_model_tags (
    model_id TEXT NOT NULL REFERENCES registered_models(id) ON DELETE CASCADE,
    key      TEXT NOT NULL,
    value    TEXT NOT NULL,
    PRIMARY KEY (model_id, key)
);

CREATE TABLE model_versions (
    model_id    TEXT NOT NULL REFERENCES registered_models(id) ON DELETE CASCADE,
    version     BIGINT NOT NULL,
    -- The run it was made from (kept when that run is deleted later: a version outlives it).
    run_id      TEXT NULL,
    -- What it points at: `checkpoint:<dir name>` of the run, or an artifact URI.
    source      TEXT NOT NULL,
    -- READY (this registry copies nothing, so a version is ready when it is created).
    status      TEXT NOT NULL,
    description TEXT NOT NULL,
    created_by  TEXT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (model_id, version)
);
CREATE INDEX model_versions_run_idx ON model_versions (run_id);

CREATE TABLE model_version_tags (
    model_id TEXT NOT NULL,
    version  BIGINT NOT NULL,
    key      TEXT NOT NULL,
    value    TEXT NOT NULL,
    PRIMARY KEY (model_id, version, key),
    FOREIGN KEY (model_id, version) REFERENCES model_versions(model_id, version) ON DELETE CASCADE
);

CREATE TABLE model_aliases (
    model_id TEXT NOT NULL REFERENCES registered_models(id) ON DELETE CASCADE,
    alias    TEXT NOT NULL,
    version  BIGINT NOT NULL,
    PRIMARY KEY (model_id, alias),
    FOREIGN KEY (model_id, version) REFERENCES model_versions(model_id, version) ON DELETE CASCADE
);
