//! `Accounts` for both databases: users, sessions, tokens, teams, grants, levels, audit log.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::SqlStore;
use crate::store::accounts::{
    Accounts, ApiToken, AuditEntry, AuditNew, AuditQuery, Grant, Level, RunAccess, Session,
    SessionNew, Sharing, Team, TokenNew, TokenScope, User,
};
use crate::store::common::{self, parse_status};
use crate::store::sql::{Row, Sql};
use crate::store::{now_ms, Experiment, StoreError, StoreResult};

/// A user's columns, named with a `u_` prefix so they stay apart from those of a session or
/// token selected beside them ([`user`] reads them by name).
const USER_COLUMNS: &str = "u.id AS u_id, u.name AS u_name, u.is_admin AS u_is_admin, \
     u.disabled AS u_disabled, u.created_at AS u_created_at, \
     u.password_hash IS NOT NULL AS u_has_password";
/// A token's columns ([`token`] reads them by name).
const TOKEN_COLUMNS: &str = "t.id AS id, t.name AS name, t.scope AS scope, \
     t.user_id AS user_id, t.run_id AS run_id, t.created_at AS created_at, \
     t.expires_at AS expires_at, t.last_used_at AS last_used_at, t.revoked_at AS revoked_at";

/// The user of a row that selected [`USER_COLUMNS`].
fn user(row: &Row) -> Result<User, sqlx::Error> {
    Ok(User {
        id: row.col("u_id")?,
        name: row.col("u_name")?,
        is_admin: row.col("u_is_admin")?,
        disabled: row.col("u_disabled")?,
        created_at: row.col("u_created_at")?,
        has_password: row.col("u_has_password")?,
    })
}

fn token(row: &Row) -> StoreResult<ApiToken> {
    let scope: String = row.col("scope")?;
    Ok(ApiToken {
        id: row.col("id")?,
        name: row.col("name")?,
        scope: TokenScope::parse(&scope).ok_or_else(|| corrupt("token scope", &scope))?,
        user_id: row.col("user_id")?,
        run_id: row.col("run_id")?,
        created_at: row.col("created_at")?,
        expires_at: row.col("expires_at")?,
        last_used_at: row.col("last_used_at")?,
        revoked_at: row.col("revoked_at")?,
    })
}

pub(super) fn level(text: &str) -> StoreResult<Level> {
    Level::parse(text).ok_or_else(|| corrupt("level", text))
}

/// A stored value the code does not know: the database was changed by hand or by a newer
/// version. A logged 500, never a guess.
pub(super) fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Database(sqlx::Error::Protocol(format!(
        "unknown {what} `{value}` in the database"
    )))
}

fn not_found(entity: &'static str, id: &str) -> StoreError {
    StoreError::NotFound {
        entity,
        id: id.to_string(),
    }
}

impl SqlStore {
    /// One statement in its own write transaction; returns the rows it changed.
    async fn write(&self, q: Sql) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        let result = tx.execute(q).await.map_err(StoreError::from);
        tx.finish(result).await
    }

    /// Several statements, atomically.
    async fn write_all(&self, statements: Vec<Sql>) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let mut result = Ok(());
        for q in statements {
            if let Err(e) = tx.execute(q).await {
                result = Err(StoreError::from(e));
                break;
            }
        }
        tx.finish(result).await
    }

    async fn user_where(&self, column: &str, value: &str) -> StoreResult<Option<User>> {
        let q = Sql::new(format!(
            "SELECT {USER_COLUMNS} FROM users u WHERE u.{column} = $1"
        ));
        let row = self.reader().await?.fetch_optional(q.bind(value)).await?;
        Ok(row.map(|r| user(&r)).transpose()?)
    }

    async fn team_members(&self, team_id: &str) -> StoreResult<Vec<String>> {
        let q = Sql::new(
            "SELECT u.name FROM team_members m JOIN users u ON u.id = m.user_id \
             WHERE m.team_id = $1 ORDER BY u.name",
        );
        let rows = self.reader().await?.fetch_all(q.bind(team_id)).await?;
        Ok(rows
            .iter()
            .map(|r| r.col("name"))
            .collect::<Result<_, _>>()?)
    }

    async fn team_where(&self, column: &str, value: &str) -> StoreResult<Option<Team>> {
        let q = Sql::new(format!(
            "SELECT id, name, created_at FROM teams WHERE {column} = $1"
        ));
        let Some(row) = self.reader().await?.fetch_optional(q.bind(value)).await? else {
            return Ok(None);
        };
        let id: String = row.col("id")?;
        Ok(Some(Team {
            members: self.team_members(&id).await?,
            name: row.col("name")?,
            created_at: row.col("created_at")?,
            id,
        }))
    }
}

#[async_trait]
impl Accounts for SqlStore {
    async fn create_user(
        &self,
        name: &str,
        password_hash: Option<&str>,
        is_admin: bool,
    ) -> StoreResult<User> {
        let name = common::valid_name("name", name)?;
        let id = common::new_id();
        let now = now_ms();
        let q = Sql::new(
            "INSERT INTO users (id, name, password_hash, is_admin, disabled, created_at, \
             password_changed_at) VALUES ($1, $2, $3, $4, $5, $6, $6)",
        )
        .bind(&id)
        .bind(name)
        .bind(password_hash)
        .bind(is_admin)
        .bind(false)
        .bind(now);
        let mut tx = self.begin_write().await?;
        let result = tx
            .execute(q)
            .await
            .map_err(|e| common::map_constraint(e, "name", &format!("user `{name}`")));
        tx.finish(result).await?;
        self.get_user(&id).await
    }

    async fn get_user(&self, id: &str) -> StoreResult<User> {
        self.user_where("id", id)
            .await?
            .ok_or_else(|| not_found("user", id))
    }

    async fn user_by_name(&self, name: &str) -> StoreResult<Option<User>> {
        self.user_where("name", name).await
    }

    async fn list_users(&self) -> StoreResult<Vec<User>> {
        let q = Sql::new(format!(
            "SELECT {USER_COLUMNS} FROM users u ORDER BY u.name"
        ));
        let rows = self.reader().await?.fetch_all(q).await?;
        Ok(rows.iter().map(user).collect::<Result<_, _>>()?)
    }

    async fn password_hash(&self, user_id: &str) -> StoreResult<Option<String>> {
        let q = Sql::new("SELECT password_hash FROM users WHERE id = $1").bind(user_id);
        let row = self.reader().await?.fetch_optional(q).await?;
        Ok(row.map(|r| r.col("password_hash")).transpose()?.flatten())
    }

    async fn set_password(&self, user_id: &str, hash: &str, now: i64) -> StoreResult<()> {
        self.write_all(vec![
            Sql::new("UPDATE users SET password_hash = $1, password_changed_at = $2 WHERE id = $3")
                .bind(hash)
                .bind(now)
                .bind(user_id),
            Sql::new("DELETE FROM sessions WHERE user_id = $1").bind(user_id),
        ])
        .await
    }

    async fn set_user_disabled(&self, user_id: &str, disabled: bool) -> StoreResult<()> {
        let mut statements = vec![Sql::new("UPDATE users SET disabled = $1 WHERE id = $2")
            .bind(disabled)
            .bind(user_id)];
        if disabled {
            statements.push(Sql::new("DELETE FROM sessions WHERE user_id = $1").bind(user_id));
        }
        self.write_all(statements).await
    }

    async fn set_user_admin(&self, user_id: &str, is_admin: bool) -> StoreResult<()> {
        let q = Sql::new("UPDATE users SET is_admin = $1 WHERE id = $2")
            .bind(is_admin)
            .bind(user_id);
        self.write(q).await.map(drop)
    }

    async fn create_session(&self, new: SessionNew) -> StoreResult<()> {
        let q = Sql::new(
            "INSERT INTO sessions (id_hash, user_id, csrf_hash, created_at, last_seen_at, \
             expires_at, client) VALUES ($1, $2, $3, $4, $4, $5, $6)",
        )
        .bind(new.id_hash)
        .bind(new.user_id)
        .bind(new.csrf_hash)
        .bind(new.now)
        .bind(new.expires_at)
        .bind(new.client);
        self.write(q).await.map(drop)
    }

    async fn session(&self, id_hash: &str) -> StoreResult<Option<(Session, User)>> {
        let q = Sql::new(format!(
            "SELECT s.user_id AS user_id, s.csrf_hash AS csrf_hash, s.created_at AS created_at, \
             s.last_seen_at AS last_seen_at, s.expires_at AS expires_at, \
             {USER_COLUMNS} FROM sessions s JOIN users u ON u.id = s.user_id \
             WHERE s.id_hash = $1"
        ))
        .bind(id_hash);
        let Some(row) = self.reader().await?.fetch_optional(q).await? else {
            return Ok(None);
        };
        let session = Session {
            user_id: row.col("user_id")?,
            csrf_hash: row.col("csrf_hash")?,
            created_at: row.col("created_at")?,
            last_seen_at: row.col("last_seen_at")?,
            expires_at: row.col("expires_at")?,
        };
        Ok(Some((session, user(&row)?)))
    }

    async fn touch_session(&self, id_hash: &str, now: i64) -> StoreResult<()> {
        let q = Sql::new("UPDATE sessions SET last_seen_at = $1 WHERE id_hash = $2")
            .bind(now)
            .bind(id_hash);
        self.write(q).await.map(drop)
    }

    async fn delete_session(&self, id_hash: &str) -> StoreResult<()> {
        let q = Sql::new("DELETE FROM sessions WHERE id_hash = $1").bind(id_hash);
        self.write(q).await.map(drop)
    }

    async fn create_token(&self, new: TokenNew) -> StoreResult<ApiToken> {
        let q = Sql::new(
            "INSERT INTO api_tokens (id, secret_hash, user_id, run_id, name, scope, created_at, \
             expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&new.id)
        .bind(new.secret_hash)
        .bind(new.user_id)
        .bind(new.run_id)
        .bind(new.name)
        .bind(new.scope.as_str())
        .bind(new.created_at)
        .bind(new.expires_at);
        self.write(q).await?;
        self.get_token(&new.id)
            .await?
            .ok_or_else(|| not_found("token", &new.id))
    }

    async fn token_by_hash(
        &self,
        secret_hash: &str,
    ) -> StoreResult<Option<(ApiToken, Option<User>)>> {
        let q = Sql::new(format!(
            "SELECT {TOKEN_COLUMNS}, {USER_COLUMNS} FROM api_tokens t \
             LEFT JOIN users u ON u.id = t.user_id WHERE t.secret_hash = $1"
        ))
        .bind(secret_hash);
        let Some(row) = self.reader().await?.fetch_optional(q).await? else {
            return Ok(None);
        };
        let t = token(&row)?;
        let owner = match t.user_id {
            Some(_) => Some(user(&row)?),
            None => None,
        };
        Ok(Some((t, owner)))
    }

    async fn get_token(&self, id: &str) -> StoreResult<Option<ApiToken>> {
        let q = Sql::new(format!(
            "SELECT {TOKEN_COLUMNS} FROM api_tokens t WHERE t.id = $1"
        ));
        let row = self.reader().await?.fetch_optional(q.bind(id)).await?;
        row.as_ref().map(token).transpose()
    }

    async fn list_tokens(&self, user_id: &str) -> StoreResult<Vec<ApiToken>> {
        let q = Sql::new(format!(
            "SELECT {TOKEN_COLUMNS} FROM api_tokens t WHERE t.user_id = $1 \
             ORDER BY t.created_at DESC, t.id"
        ));
        let rows = self.reader().await?.fetch_all(q.bind(user_id)).await?;
        rows.iter().map(token).collect()
    }

    async fn revoke_token(&self, id: &str, now: i64) -> StoreResult<()> {
        let q =
            Sql::new("UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                .bind(now)
                .bind(id);
        self.write(q).await.map(drop)
    }

    async fn revoke_run_tokens(&self, run_id: &str, now: i64) -> StoreResult<()> {
        let q = Sql::new(
            "UPDATE api_tokens SET revoked_at = $1 WHERE run_id = $2 AND revoked_at IS NULL",
        )
        .bind(now)
        .bind(run_id);
        self.write(q).await.map(drop)
    }

    async fn touch_token(&self, id: &str, now: i64) -> StoreResult<()> {
        let q = Sql::new("UPDATE api_tokens SET last_used_at = $1 WHERE id = $2")
            .bind(now)
            .bind(id);
        self.write(q).await.map(drop)
    }

    async fn create_team(&self, name: &str) -> StoreResult<Team> {
        let name = common::valid_name("name", name)?;
        let q = Sql::new("INSERT INTO teams (id, name, created_at) VALUES ($1, $2, $3)")
            .bind(common::new_id())
            .bind(name)
            .bind(now_ms());
        let mut tx = self.begin_write().await?;
        let result = tx
            .execute(q)
            .await
            .map_err(|e| common::map_constraint(e, "name", &format!("team `{name}`")));
        tx.finish(result).await?;
        self.team_where("name", name)
            .await?
            .ok_or_else(|| not_found("team", name))
    }

    async fn list_teams(&self) -> StoreResult<Vec<Team>> {
        let q = Sql::new("SELECT id FROM teams ORDER BY name");
        let rows = self.reader().await?.fetch_all(q).await?;
        let mut teams = Vec::with_capacity(rows.len());
        for row in rows {
            let id: String = row.col("id")?;
            if let Some(team) = self.team_where("id", &id).await? {
                teams.push(team);
            }
        }
        Ok(teams)
    }

    async fn get_team(&self, id_or_name: &str) -> StoreResult<Option<Team>> {
        match self.team_where("id", id_or_name).await? {
            Some(team) => Ok(Some(team)),
            None => self.team_where("name", id_or_name).await,
        }
    }

    async fn add_team_member(&self, team_id: &str, user_id: &str) -> StoreResult<()> {
        let q = Sql::new(
            "INSERT INTO team_members (team_id, user_id) VALUES ($1, $2) \
             ON CONFLICT (team_id, user_id) DO NOTHING",
        )
        .bind(team_id)
        .bind(user_id);
        self.write(q).await.map(drop)
    }

    async fn remove_team_member(&self, team_id: &str, user_id: &str) -> StoreResult<()> {
        let q = Sql::new("DELETE FROM team_members WHERE team_id = $1 AND user_id = $2")
            .bind(team_id)
            .bind(user_id);
        self.write(q).await.map(drop)
    }

    async fn create_experiment_owned(
        &self,
        name: &str,
        owner_id: Option<&str>,
        default_level: Level,
    ) -> StoreResult<Experiment> {
        self.insert_owned_experiment(name, owner_id, default_level, false)
            .await?
            .ok_or_else(|| not_found("experiment", name))
    }

    async fn resolve_experiment_owned(
        &self,
        id_or_name: &str,
        owner_id: Option<&str>,
        default_level: Level,
    ) -> StoreResult<Experiment> {
        match self.find_experiment(id_or_name).await {
            Err(StoreError::NotFound { .. }) => {}
            other => return other,
        }
        // Two requests naming the same new experiment: one creates it, both use it.
        self.insert_owned_experiment(id_or_name, owner_id, default_level, true)
            .await?
            .ok_or_else(|| not_found("experiment", id_or_name))
    }

    async fn rename_experiment(&self, id: &str, name: &str) -> StoreResult<()> {
        self.rename_experiment_row(id, name).await
    }

    async fn experiment_sharing(&self, id: &str) -> StoreResult<Sharing> {
        let q = Sql::new(
            "SELECT (SELECT u.name FROM users u WHERE u.id = e.owner_id) AS owner, \
             e.default_level AS default_level FROM experiments e WHERE e.id = $1",
        )
        .bind(id);
        let row = self
            .reader()
            .await?
            .fetch_optional(q)
            .await?
            .ok_or_else(|| not_found("experiment", id))?;
        let default: String = row.col("default_level")?;
        Ok(Sharing {
            owner: row.col("owner")?,
            default_level: level(&default)?,
        })
    }

    async fn set_experiment_default_level(&self, id: &str, level: Level) -> StoreResult<()> {
        let q = Sql::new("UPDATE experiments SET default_level = $1 WHERE id = $2")
            .bind(level.as_str())
            .bind(id);
        self.write(q).await.map(drop)
    }

    async fn set_grant(
        &self,
        experiment_id: &str,
        subject_kind: &str,
        subject_id: &str,
        level: Level,
    ) -> StoreResult<()> {
        let q = if level == Level::None {
            Sql::new(
                "DELETE FROM experiment_grants WHERE experiment_id = $1 AND subject_kind = $2 \
                 AND subject_id = $3",
            )
        } else {
            Sql::new(
                "INSERT INTO experiment_grants (experiment_id, subject_kind, subject_id, level) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (experiment_id, subject_kind, subject_id) \
                 DO UPDATE SET level = excluded.level",
            )
        };
        let mut q = q.bind(experiment_id).bind(subject_kind).bind(subject_id);
        if level != Level::None {
            q = q.bind(level.as_str());
        }
        self.write(q).await.map(drop)
    }

    async fn list_grants(&self, experiment_id: &str) -> StoreResult<Vec<Grant>> {
        self.grants_of(experiment_id).await
    }

    async fn experiment_levels(&self, user_id: &str) -> StoreResult<BTreeMap<String, Level>> {
        let mut levels: BTreeMap<String, Level> = BTreeMap::new();
        for (experiment, level) in self.level_sources(user_id, None).await? {
            let entry = levels.entry(experiment).or_insert(Level::None);
            *entry = (*entry).max(level);
        }
        levels.retain(|_, l| *l > Level::None);
        Ok(levels)
    }

    async fn experiment_level(&self, user_id: &str, experiment_id: &str) -> StoreResult<Level> {
        Ok(self
            .level_sources(user_id, Some(experiment_id))
            .await?
            .into_iter()
            .map(|(_, l)| l)
            .max()
            .unwrap_or(Level::None))
    }

    async fn granted_level(&self, user_id: &str, experiment_id: &str) -> StoreResult<Level> {
        Ok(self
            .granted_sources(user_id, experiment_id)
            .await?
            .into_iter()
            .max()
            .unwrap_or(Level::None))
    }

    async fn run_access(&self, run_id: &str) -> StoreResult<RunAccess> {
        let q = Sql::new(
            "SELECT experiment_id, status, deleted_at, created_by FROM runs WHERE id = $1",
        )
        .bind(run_id);
        let row = self
            .reader()
            .await?
            .fetch_optional(q)
            .await?
            .ok_or_else(|| common::not_found_run(run_id))?;
        let status: String = row.col("status")?;
        Ok(RunAccess {
            experiment_id: row.col("experiment_id")?,
            status: parse_status(&status)?,
            deleted: row.col::<Option<i64>>("deleted_at")?.is_some(),
            created_by: row.col("created_by")?,
        })
    }

    async fn delete_run(&self, run_id: &str) -> StoreResult<()> {
        // Points and rollups have no foreign key to their series on Postgres (it cost a
        // trigger per row), so they go first; every other table that refers to a run does so
        // with ON DELETE CASCADE.
        let mut tx = self.begin_write().await?;
        let deleted = delete_run_in(&mut tx, run_id).await;
        match tx.finish(deleted).await? {
            0 => Err(common::not_found_run(run_id)),
            _ => Ok(()),
        }
    }

    async fn append_audit(&self, e: AuditNew) -> StoreResult<()> {
        let q = Sql::new(
            "INSERT INTO audit_log (time, actor, client, action, target, detail) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(e.time)
        .bind(e.actor)
        .bind(e.client)
        .bind(e.action)
        .bind(e.target)
        .bind(e.detail);
        self.write(q).await.map(drop)
    }

    async fn list_audit(&self, query: &AuditQuery) -> StoreResult<Vec<AuditEntry>> {
        self.audit_entries(query).await
    }
}

/// Deletes a run with its points and rollups; the number of runs deleted.
async fn delete_run_in(tx: &mut crate::store::sql::Conn, run_id: &str) -> StoreResult<u64> {
    for table in ["metric_points", "metric_rollups"] {
        let q = Sql::new(format!(
            "DELETE FROM {table} WHERE series_id IN \
             (SELECT id FROM metric_series WHERE run_id = $1)"
        ));
        tx.execute(q.bind(run_id)).await?;
    }
    let q = Sql::new("DELETE FROM runs WHERE id = $1").bind(run_id);
    Ok(tx.execute(q).await?)
}
