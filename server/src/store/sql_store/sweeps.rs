//! `Sweeps` for both databases: sweeps, their spec versions and their trials.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::accounts::corrupt;
use super::SqlStore;
use crate::store::common;
use crate::store::sql::{Row, Sql};
use crate::store::sweeps::{
    SweepRow, SweepState, SweepVersion, Sweeps, TrialRow, TrialState, TrialUpdate,
};
use crate::store::{now_ms, StoreError, StoreResult};

/// The columns of `sweeps` (the insert writes them, [`sweep`] reads them by name).
const SWEEP_COLUMNS: &str = "id, experiment_id, name, spec, version, state, message, \
     created_by, created_at, updated_at, ended_at";
/// The columns of `sweep_trials` [`trial`] reads, by name.
const TRIAL_COLUMNS: &str = "number, run_id, params, state, value, step, rungs, bracket, \
     reason, created_at, ended_at";

fn json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|_| corrupt(what, text))
}

fn to_text<T: serde::Serialize>(value: &T) -> StoreResult<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Database(sqlx::Error::Protocol(e.to_string())))
}

fn sweep(row: &Row) -> StoreResult<SweepRow> {
    let spec: String = row.col("spec")?;
    let state: String = row.col("state")?;
    Ok(SweepRow {
        id: row.col("id")?,
        experiment_id: row.col("experiment_id")?,
        name: row.col("name")?,
        spec: json("sweep spec", &spec)?,
        version: row.col("version")?,
        state: SweepState::parse(&state).ok_or_else(|| corrupt("sweep state", &state))?,
        message: row.col("message")?,
        created_by: row.col("created_by")?,
        created_at: row.col("created_at")?,
        updated_at: row.col("updated_at")?,
        ended_at: row.col("ended_at")?,
    })
}

fn trial(row: &Row) -> StoreResult<TrialRow> {
    let params: String = row.col("params")?;
    let state: String = row.col("state")?;
    let rungs: String = row.col("rungs")?;
    Ok(TrialRow {
        number: row.col("number")?,
        run_id: row.col("run_id")?,
        params: json("trial params", &params)?,
        state: TrialState::parse(&state).ok_or_else(|| corrupt("trial state", &state))?,
        value: row.col("value")?,
        step: row.col("step")?,
        rungs: json::<BTreeMap<u32, f64>>("trial rungs", &rungs)?,
        bracket: row.col("bracket")?,
        reason: row.col("reason")?,
        created_at: row.col("created_at")?,
        ended_at: row.col("ended_at")?,
    })
}

fn sweep_not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        entity: "sweep",
        id: id.to_string(),
    }
}

impl SqlStore {
    async fn sweep_write(&self, statements: Vec<Sql>) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        let mut result = Ok(0);
        for q in statements {
            match tx.execute(q).await {
                Ok(n) => result = result.map(|total| total + n),
                Err(e) => {
                    result = Err(StoreError::from(e));
                    break;
                }
            }
        }
        tx.finish(result).await
    }
}

#[async_trait]
impl Sweeps for SqlStore {
    async fn create_sweep(
        &self,
        experiment_id: &str,
        name: &str,
        spec: &serde_json::Value,
        created_by: Option<&str>,
    ) -> StoreResult<SweepRow> {
        let id = common::new_id();
        let now = now_ms();
        let spec_text = to_text(spec)?;
        self.sweep_write(vec![
            Sql::new(format!(
                "INSERT INTO sweeps ({SWEEP_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, 1, 'running', NULL, $5, $6, $6, NULL)"
            ))
            .bind(&id)
            .bind(experiment_id)
            .bind(name)
            .bind(&spec_text)
            .bind(created_by)
            .bind(now),
            Sql::new(
                "INSERT INTO sweep_versions (sweep_id, version, spec, changes, changed_by, \
                 changed_at) VALUES ($1, 1, $2, $3, $4, $5)",
            )
            .bind(&id)
            .bind(&spec_text)
            .bind(to_text(&["created".to_string()])?)
            .bind(created_by)
            .bind(now),
        ])
        .await?;
        self.get_sweep(&id).await
    }

    async fn get_sweep(&self, id: &str) -> StoreResult<SweepRow> {
        let q = Sql::new(format!("SELECT {SWEEP_COLUMNS} FROM sweeps WHERE id = $1")).bind(id);
        let row = self.reader().await?.fetch_optional(q).await?;
        row.map(|r| sweep(&r))
            .transpose()?
            .ok_or_else(|| sweep_not_found(id))
    }

    async fn list_sweeps(&self, experiment_ids: Option<&[String]>) -> StoreResult<Vec<SweepRow>> {
        let mut q = Sql::new(format!("SELECT {SWEEP_COLUMNS} FROM sweeps"));
        if let Some(ids) = experiment_ids {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            q.push(" WHERE experiment_id IN ")
                .tuple(ids.iter().map(String::as_str));
        }
        q.push(" ORDER BY created_at DESC, id DESC");
        let rows = self.reader().await?.fetch_all(q).await?;
        rows.iter().map(sweep).collect()
    }

    async fn live_sweeps(&self) -> StoreResult<Vec<SweepRow>> {
        let q = Sql::new(format!(
            "SELECT {SWEEP_COLUMNS} FROM sweeps WHERE state IN ('running', 'paused') \
             ORDER BY created_at"
        ));
        let rows = self.reader().await?.fetch_all(q).await?;
        rows.iter().map(sweep).collect()
    }

    async fn set_sweep_state(
        &self,
        id: &str,
        state: SweepState,
        message: Option<&str>,
    ) -> StoreResult<()> {
        let now = now_ms();
        let ended = state.is_over().then_some(now);
        let q = Sql::new(
            "UPDATE sweeps SET state = $1, message = $2, updated_at = $3, ended_at = $4 \
             WHERE id = $5",
        )
        .bind(state.as_str())
        .bind(message)
        .bind(now)
        .bind(ended)
        .bind(id);
        match self.sweep_write(vec![q]).await? {
            0 => Err(sweep_not_found(id)),
            _ => Ok(()),
        }
    }

    async fn change_sweep_spec(
        &self,
        id: &str,
        expected_version: i64,
        spec: &serde_json::Value,
        changes: &[String],
        changed_by: Option<&str>,
    ) -> StoreResult<i64> {
        let now = now_ms();
        let version = expected_version + 1;
        let spec_text = to_text(spec)?;
        let mut tx = self.begin_write().await?;
        let update = Sql::new(
            "UPDATE sweeps SET spec = $1, version = $2, updated_at = $3 \
             WHERE id = $4 AND version = $5",
        )
        .bind(&spec_text)
        .bind(version)
        .bind(now)
        .bind(id)
        .bind(expected_version);
        let result = match tx.execute(update).await {
            Err(e) => Err(StoreError::from(e)),
            Ok(0) => Err(StoreError::Conflict {
                field: Some("version"),
                message: format!(
                    "the sweep changed meanwhile (it is no longer at version {expected_version}); \
                     read it again and repeat the change"
                ),
            }),
            Ok(_) => {
                let insert = Sql::new(
                    "INSERT INTO sweep_versions (sweep_id, version, spec, changes, changed_by, \
                     changed_at) VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(id)
                .bind(version)
                .bind(&spec_text)
                .bind(to_text(&changes)?)
                .bind(changed_by)
                .bind(now);
                tx.execute(insert)
                    .await
                    .map(|_| version)
                    .map_err(StoreError::from)
            }
        };
        tx.finish(result).await
    }

    async fn sweep_versions(&self, id: &str) -> StoreResult<Vec<SweepVersion>> {
        let q = Sql::new(
            "SELECT version, spec, changes, changed_by, changed_at FROM sweep_versions \
             WHERE sweep_id = $1 ORDER BY version",
        )
        .bind(id);
        let rows = self.reader().await?.fetch_all(q).await?;
        rows.iter()
            .map(|r| {
                let spec: String = r.col("spec")?;
                let changes: String = r.col("changes")?;
                Ok(SweepVersion {
                    version: r.col("version")?,
                    spec: json("sweep spec", &spec)?,
                    changes: json("sweep changes", &changes)?,
                    changed_by: r.col("changed_by")?,
                    changed_at: r.col("changed_at")?,
                })
            })
            .collect()
    }

    async fn add_trial(
        &self,
        sweep_id: &str,
        number: i64,
        params: &serde_json::Map<String, serde_json::Value>,
        bracket: Option<i64>,
    ) -> StoreResult<()> {
        let q = Sql::new(
            "INSERT INTO sweep_trials (sweep_id, number, run_id, params, state, value, step, \
             rungs, bracket, reason, created_at, ended_at) \
             VALUES ($1, $2, NULL, $3, 'pending', NULL, NULL, '{}', $4, NULL, $5, NULL) \
             ON CONFLICT (sweep_id, number) DO NOTHING",
        )
        .bind(sweep_id)
        .bind(number)
        .bind(to_text(params)?)
        .bind(bracket)
        .bind(now_ms());
        self.sweep_write(vec![q]).await.map(drop)
    }

    async fn set_trial_run(&self, sweep_id: &str, number: i64, run_id: &str) -> StoreResult<()> {
        let q = Sql::new(
            "UPDATE sweep_trials SET run_id = $1, state = 'running' \
             WHERE sweep_id = $2 AND number = $3",
        )
        .bind(run_id)
        .bind(sweep_id)
        .bind(number);
        self.sweep_write(vec![q]).await.map(drop)
    }

    async fn update_trial(
        &self,
        sweep_id: &str,
        number: i64,
        update: &TrialUpdate,
    ) -> StoreResult<()> {
        let q = Sql::new(
            "UPDATE sweep_trials SET state = $1, value = $2, step = $3, rungs = $4, \
             reason = $5, ended_at = $6 WHERE sweep_id = $7 AND number = $8",
        )
        .bind(update.state.as_str())
        .bind(update.value.filter(|v| v.is_finite()))
        .bind(update.step)
        .bind(to_text(&update.rungs)?)
        .bind(update.reason.as_deref())
        .bind(update.ended_at)
        .bind(sweep_id)
        .bind(number);
        self.sweep_write(vec![q]).await.map(drop)
    }

    async fn trials(&self, sweep_id: &str) -> StoreResult<Vec<TrialRow>> {
        let q = Sql::new(format!(
            "SELECT {TRIAL_COLUMNS} FROM sweep_trials WHERE sweep_id = $1 ORDER BY number"
        ))
        .bind(sweep_id);
        let rows = self.reader().await?.fetch_all(q).await?;
        rows.iter().map(trial).collect()
    }

    async fn trial_of_run(&self, run_id: &str) -> StoreResult<Option<(String, i64)>> {
        let q =
            Sql::new("SELECT sweep_id, number FROM sweep_trials WHERE run_id = $1").bind(run_id);
        let row = self.reader().await?.fetch_optional(q).await?;
        Ok(row
            .map(|r| Ok::<_, sqlx::Error>((r.col("sweep_id")?, r.col("number")?)))
            .transpose()?)
    }
}
