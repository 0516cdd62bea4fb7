-- Hyperparameter sweeps: the sweep (its current spec and state), every version of its spec, and
-- its trials. The controller writes a trial (its parameters) before it launches the trial's run,
-- and links the run after, so a restart in between neither loses the trial nor launches it
-- twice (the run carries the sweep and trial number in its tags).

CREATE TABLE sweeps (
    id            TEXT PRIMARY KEY,
    experiment_id TEXT NOT NULL REFERENCES experiments(id),
    name          TEXT NOT NULL,
    -- The current version's spec, as JSON.
    spec          TEXT NOT NULL,
    version       BIGINT NOT NULL,
    -- running | paused | finished | stopped
    state         TEXT NOT NULL,
    -- Why it is in its state (finished: budget spent; stopped: by whom).
    message       TEXT NULL,
    created_by    TEXT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    ended_at      BIGINT NULL
);
CREATE INDEX sweeps_experiment_idx ON sweeps (experiment_id, created_at);

CREATE TABLE sweep_versions (
    sweep_id   TEXT NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
    version    BIGINT NOT NULL,
    spec       TEXT NOT NULL,
    -- What changed from the version before, as a JSON list of sentences.
    changes    TEXT NOT NULL,
    changed_by TEXT NULL,
    changed_at BIGINT NOT NULL,
    PRIMARY KEY (sweep_id, version)
);

CREATE TABLE sweep_trials (
    sweep_id   TEXT NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
    number     BIGINT NOT NULL,
    run_id     TEXT NULL,
    -- The suggested parameters, as a JSON object of config key to value.
    params     TEXT NOT NULL,
    -- pending (not launched yet) | running | complete | pruned | failed | stopped
    state      TEXT NOT NULL,
    -- The objective: the metric's last value (complete, pruned).
    value      DOUBLE PRECISION NULL,
    -- The last step of the metric seen.
    step       BIGINT NULL,
    -- The early-stopping rule's records (JSON object: rung -> value).
    rungs      TEXT NOT NULL,
    bracket    BIGINT NULL,
    reason     TEXT NULL,
    created_at BIGINT NOT NULL,
    ended_at   BIGINT NULL,
    PRIMARY KEY (sweep_id, number)
);
CREATE UNIQUE INDEX sweep_trials_run_idx ON sweep_trials (run_id);
