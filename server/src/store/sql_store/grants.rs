//! The queries behind `Accounts` that read across tables: where a user's levels come from,
//! experiments created with an owner, an experiment's grants, and the audit log's pages.

use super::accounts::{corrupt, level};
use super::SqlStore;
use crate::store::accounts::{AuditEntry, AuditQuery, Grant, Level, Subject};
use crate::store::sql::Sql;
use crate::store::{Experiment, StoreResult};

impl SqlStore {
    /// (experiment id, level) pairs that give the user access, from every source; the caller
    /// takes the highest per experiment.
    pub(super) async fn level_sources(
        &self,
        user_id: &str,
        experiment_id: Option<&str>,
    ) -> StoreResult<Vec<(String, Level)>> {
        let only = |column: &str| match experiment_id {
            Some(_) => format!(" AND {column} = $2"),
            None => String::new(),
        };
        let mut q = Sql::new(format!(
            "SELECT id AS experiment_id, 'manage' AS level FROM experiments WHERE owner_id = $1{} \
             UNION ALL SELECT id, default_level FROM experiments \
               WHERE default_level <> 'none'{} \
             UNION ALL SELECT experiment_id, level FROM experiment_grants \
               WHERE subject_kind = 'user' AND subject_id = $1{} \
             UNION ALL SELECT g.experiment_id, g.level FROM experiment_grants g \
               JOIN team_members m ON g.subject_kind = 'team' AND g.subject_id = m.team_id \
               WHERE m.user_id = $1{}",
            only("id"),
            only("id"),
            only("experiment_id"),
            only("g.experiment_id"),
        ))
        .bind(user_id);
        if let Some(e) = experiment_id {
            q = q.bind(e);
        }
        let rows = self.reader().await?.fetch_all(q).await?;
        rows.iter()
            .map(|r| {
                let text: String = r.col("level")?;
                Ok((r.col("experiment_id")?, level(&text)?))
            })
            .collect()
    }

    /// The levels given to the user in particular on one experiment (as its owner, its own
    /// grant, its teams' grants): `level_sources` without the experiment's default level.
    pub(super) async fn granted_sources(
        &self,
        user_id: &str,
        experiment_id: &str,
    ) -> StoreResult<Vec<Level>> {
        let q = Sql::new(
            "SELECT 'manage' AS level FROM experiments WHERE owner_id = $1 AND id = $2 \
             UNION ALL SELECT level FROM experiment_grants \
               WHERE subject_kind = 'user' AND subject_id = $1 AND experiment_id = $2 \
             UNION ALL SELECT g.level FROM experiment_grants g \
               JOIN team_members m ON g.subject_kind = 'team' AND g.subject_id = m.team_id \
               WHERE m.user_id = $1 AND g.experiment_id = $2",
        )
        .bind(user_id)
        .bind(experiment_id);
        let rows = self.reader().await?.fetch_all(q).await?;
        rows.iter()
            .map(|r| {
                let text: String = r.col("level")?;
                level(&text)
            })
            .collect()
    }

    pub(super) async fn insert_owned_experiment(
        &self,
        name: &str,
        owner_id: Option<&str>,
        default_level: Level,
        on_conflict_nothing: bool,
    ) -> StoreResult<Option<Experiment>> {
        let field = if on_conflict_nothing {
            "experiment"
        } else {
            "name"
        };
        self.insert_experiment_row(field, name, owner_id, default_level, on_conflict_nothing)
            .await
            .map(Some)
    }

    pub(super) async fn grants_of(&self, experiment_id: &str) -> StoreResult<Vec<Grant>> {
        let q = Sql::new(
            "SELECT g.subject_kind AS subject_kind, g.subject_id AS subject_id, g.level AS level, \
             COALESCE((SELECT u.name FROM users u WHERE g.subject_kind = 'user' \
                       AND u.id = g.subject_id), \
                      (SELECT t.name FROM teams t WHERE g.subject_kind = 'team' \
                       AND t.id = g.subject_id), g.subject_id) AS subject_name \
             FROM experiment_grants g WHERE g.experiment_id = $1 \
             ORDER BY g.subject_kind, g.subject_id",
        )
        .bind(experiment_id);
        let rows = self.reader().await?.fetch_all(q).await?;
        rows.iter()
            .map(|r| {
                let kind: String = r.col("subject_kind")?;
                let id: String = r.col("subject_id")?;
                let name: String = r.col("subject_name")?;
                let text: String = r.col("level")?;
                let subject = match kind.as_str() {
                    "user" => Subject::User { id, name },
                    "team" => Subject::Team { id, name },
                    other => return Err(corrupt("grant subject", other)),
                };
                Ok(Grant {
                    subject,
                    level: level(&text)?,
                })
            })
            .collect()
    }

    pub(super) async fn audit_entries(&self, query: &AuditQuery) -> StoreResult<Vec<AuditEntry>> {
        let mut q = Sql::new(
            "SELECT seq, time, actor, client, action, target, detail FROM audit_log WHERE 1 = 1",
        );
        for (column, value) in [
            ("actor", &query.actor),
            ("action", &query.action),
            ("target", &query.target),
        ] {
            if let Some(v) = value {
                q.push(&format!(" AND {column} = ")).arg(v.as_str());
            }
        }
        if let Some(since) = query.since {
            q.push(" AND time >= ").arg(since);
        }
        if let Some(until) = query.until {
            q.push(" AND time < ").arg(until);
        }
        if let Some(before) = query.before_seq {
            q.push(" AND seq < ").arg(before);
        }
        q.push(" ORDER BY seq DESC LIMIT ")
            .arg(i64::try_from(query.limit).unwrap_or(i64::MAX));
        let rows = self.reader().await?.fetch_all(q).await?;
        rows.iter()
            .map(|r| {
                Ok(AuditEntry {
                    seq: r.col("seq")?,
                    time: r.col("time")?,
                    actor: r.col("actor")?,
                    client: r.col("client")?,
                    action: r.col("action")?,
                    target: r.col("target")?,
                    detail: r.col("detail")?,
                })
            })
            .collect()
    }
}
