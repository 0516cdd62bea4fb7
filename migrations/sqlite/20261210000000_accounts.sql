-- Accounts and access control: users, browser sessions, API tokens, teams, per-experiment
-- grants and the audit log. Secrets (passwords, session ids, token secrets) are stored only as
-- hashes.

CREATE TABLE users (
    id                  TEXT PRIMARY KEY,
    name                TEXT NOT NULL UNIQUE,
    -- argon2id PHC string; NULL: no password yet (cannot sign in until one is set).
    password_hash       TEXT NULL,
    is_admin            BOOLEAN NOT NULL DEFAULT FALSE,
    disabled            BOOLEAN NOT NULL DEFAULT FALSE,
    created_at          BIGINT NOT NULL,
    password_changed_at BIGINT NOT NULL
);

-- The first administrator, who owns everything that existed before accounts. It has no
-- password: `trainyard user reset-password admin` sets one (the admin token works meanwhile).
INSERT INTO users (id, name, is_admin, created_at, password_changed_at)
    VALUES ('00000000000000000000000000000001', 'admin', TRUE, 0, 0);

CREATE TABLE sessions (
    -- Hash of the cookie's secret.
    id_hash      TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    csrf_token   TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    client       TEXT NULL
);
CREATE INDEX sessions_user_idx ON sessions (user_id);

CREATE TABLE api_tokens (
    id           TEXT PRIMARY KEY,
    secret_hash  TEXT NOT NULL UNIQUE,
    -- A personal token's user, or a launched run's own token (then user_id is NULL).
    user_id      TEXT NULL REFERENCES users(id) ON DELETE CASCADE,
    run_id       TEXT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    scope        TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NULL,
    last_used_at BIGINT NULL,
    revoked_at   BIGINT NULL
);
CREATE INDEX api_tokens_user_idx ON api_tokens (user_id);
CREATE INDEX api_tokens_run_idx ON api_tokens (run_id);

CREATE TABLE teams (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);

CREATE TABLE team_members (
    team_id TEXT NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    PRIMARY KEY (team_id, user_id)
);
CREATE INDEX team_members_user_idx ON team_members (user_id);

-- The owner has MANAGE; `default_level` is what every signed-in user has.
ALTER TABLE experiments ADD COLUMN owner_id TEXT NULL REFERENCES users(id);
ALTER TABLE experiments ADD COLUMN default_level TEXT NOT NULL DEFAULT 'none';
UPDATE experiments SET owner_id = '00000000000000000000000000000001';
-- The Default experiment is the shared sandbox runs land in when none is named.
UPDATE experiments SET default_level = 'edit' WHERE id = '0';

CREATE TABLE experiment_grants (
    experiment_id TEXT NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
    subject_kind  TEXT NOT NULL,
    subject_id    TEXT NOT NULL,
    level         TEXT NOT NULL,
    PRIMARY KEY (experiment_id, subject_kind, subject_id)
);
CREATE INDEX experiment_grants_subject_idx ON experiment_grants (subject_kind, subject_id);

ALTER TABLE runs ADD COLUMN created_by TEXT NULL REFERENCES users(id);
UPDATE runs SET created_by = '00000000000000000000000000000001';
CREATE INDEX runs_created_by_idx ON runs (created_by);

-- Append-only: the store has no statement that changes or deletes a row of it.
CREATE TABLE audit_log (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    time   BIGINT NOT NULL,
    actor  TEXT NULL,
    client TEXT NULL,
    action TEXT NOT NULL,
    target TEXT NULL,
    detail TEXT NULL
);
CREATE INDEX audit_log_time_idx ON audit_log (time);
