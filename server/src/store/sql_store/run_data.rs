//! What a tracking client adds to a run besides metrics and status: params one by one
//! (write-once), tag removal, dataset inputs, a client's own start and end times, and soft
//! deletion.

use std::collections::BTreeMap;

use super::SqlStore;
use crate::store::common;
use crate::store::sql::{Conn, Row, Sql};
use crate::store::{now_ms, RunInput, StoreError, StoreResult};

/// Rows per multi-row INSERT (5 parameters each, well under either database's limit).
const CHUNK: usize = 500;

/// Inserts params; a key the run has already is left as it is (callers check values first).
pub(super) async fn insert_param_rows(
    tx: &mut Conn,
    run_id: &str,
    params: &[(String, String)],
) -> StoreResult<()> {
    if params.is_empty() {
        return Ok(());
    }
    // A param carries its run's experiment (what a search within one walks).
    let select = Sql::new("SELECT experiment_id FROM runs WHERE id = $1").bind(run_id);
    let row = tx
        .fetch_optional(select)
        .await?
        .ok_or_else(|| common::not_found_run(run_id))?;
    let experiment: String = crate::store::search::named(&row, "experiment_id")?;
    for chunk in params.chunks(CHUNK) {
        let mut insert =
            Sql::new("INSERT INTO run_params (run_id, experiment_id, key, value, num) VALUES ");
        for (i, (k, v)) in chunk.iter().enumerate() {
            if i > 0 {
                insert.push(", ");
            }
            insert
                .push("(")
                .arg(run_id)
                .push(", ")
                .arg(experiment.as_str());
            insert.push(", ").arg(k.as_str());
            insert.push(", ").arg(v.as_str());
            insert.push(", ").arg(common::param_num(v)).push(")");
        }
        insert.push(" ON CONFLICT (run_id, key) DO NOTHING");
        tx.execute(insert).await?;
    }
    Ok(())
}

fn param_conflict(key: &str, stored: &str, sent: &str) -> StoreError {
    StoreError::Conflict {
        field: Some("params"),
        message: format!(
            "param `{key}` is write-once: the run has the value `{stored}`, not `{sent}`"
        ),
    }
}

impl SqlStore {
    pub(super) async fn put_run_times(
        &self,
        id: &str,
        started_at: Option<i64>,
        ended_at: Option<i64>,
    ) -> StoreResult<()> {
        let set = Sql::new(
            "UPDATE runs SET started_at = COALESCE($1, started_at), \
             ended_at = COALESCE($2, ended_at) WHERE id = $3",
        )
        .bind(started_at)
        .bind(ended_at)
        .bind(id);
        let mut tx = self.begin_write().await?;
        let result = match tx.execute(set).await {
            Ok(0) => Err(common::not_found_run(id)),
            Ok(_) => Ok(()),
            Err(e) => Err(e.into()),
        };
        tx.finish(result).await
    }

    pub(super) async fn mark_run_deleted(&self, id: &str, deleted: bool) -> StoreResult<()> {
        let set = if deleted {
            Sql::new("UPDATE runs SET deleted_at = COALESCE(deleted_at, $1) WHERE id = $2")
                .bind(now_ms())
                .bind(id)
        } else {
            Sql::new("UPDATE runs SET deleted_at = NULL WHERE id = $1").bind(id)
        };
        let mut tx = self.begin_write().await?;
        let result = match tx.execute(set).await {
            Ok(0) => Err(common::not_found_run(id)),
            Ok(_) => Ok(()),
            Err(e) => Err(e.into()),
        };
        tx.finish(result).await
    }

    pub(super) async fn add_params(
        &self,
        id: &str,
        params: &[(String, String)],
    ) -> StoreResult<()> {
        let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
        for (k, v) in params {
            if k.is_empty() {
                return Err(StoreError::Invalid {
                    field: "params",
                    message: "a param key must not be empty".into(),
                });
            }
            common::no_nul("params", k)?;
            common::no_nul("params", v)?;
            if let Some(earlier) = wanted.insert(k, v) {
                if earlier != v {
                    return Err(param_conflict(k, earlier, v));
                }
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let lock = self.dialect().for_update();
        let mut tx = self.begin_write().await?;
        let result = async {
            let run = Sql::new(format!("SELECT 1 FROM runs WHERE id = $1{lock}"));
            if tx.fetch_optional(run.bind(id)).await?.is_none() {
                return Err(common::not_found_run(id));
            }
            let mut fresh = Vec::with_capacity(wanted.len());
            let keys: Vec<&str> = wanted.keys().copied().collect();
            let mut stored = BTreeMap::new();
            for chunk in keys.chunks(CHUNK) {
                let mut select =
                    Sql::new("SELECT key, value FROM run_params WHERE run_id = $1 AND key IN ")
                        .bind(id);
                select.tuple(chunk.iter().map(|k| k.to_string()));
                for row in tx.fetch_all(select).await? {
                    stored.insert(row.col::<String>("key")?, row.col::<String>("value")?);
                }
            }
            for (k, v) in &wanted {
                match stored.get(*k) {
                    Some(old) if old != v => return Err(param_conflict(k, old, v)),
                    Some(_) => {}
                    None => fresh.push((k.to_string(), v.to_string())),
                }
            }
            insert_param_rows(&mut tx, id, &fresh).await?;
            Ok(fresh.len())
        }
        .await;
        let added = tx.finish(result).await?;
        self.statistics.note_written(added as u64);
        Ok(())
    }

    pub(super) async fn remove_tag(&self, id: &str, key: &str) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let result = async {
            self.run_exists(&mut tx, id).await?;
            let delete = Sql::new("DELETE FROM run_tags WHERE run_id = $1 AND key = $2");
            if tx.execute(delete.bind(id).bind(key)).await? == 0 {
                return Err(StoreError::NotFound {
                    entity: "tag",
                    id: key.to_string(),
                });
            }
            Ok(())
        }
        .await;
        tx.finish(result).await
    }

    pub(super) async fn add_inputs(&self, id: &str, inputs: &[RunInput]) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let result = async {
            // The run's row locked, so two requests cannot both fit under the run's limits.
            let lock = self.dialect().for_update();
            let run = Sql::new(format!("SELECT id FROM runs WHERE id = $1{lock}")).bind(id);
            if tx.fetch_optional(run).await?.is_none() {
                return Err(common::not_found_run(id));
            }
            let stored = Sql::new("SELECT name, digest, body FROM run_inputs WHERE run_id = $1");
            let stored = tx
                .fetch_all(stored.bind(id))
                .await?
                .iter()
                .map(input_of)
                .collect::<StoreResult<Vec<RunInput>>>()?;
            crate::validate::inputs::run_inputs_fit(&stored, inputs)
                .map_err(StoreError::Rejected)?;
            for input in inputs {
                let body = input.body.to_string();
                common::no_nul("datasets", &body)?;
                let insert = Sql::new(
                    "INSERT INTO run_inputs (run_id, name, digest, body) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (run_id, name, digest) DO NOTHING",
                );
                tx.execute(
                    insert
                        .bind(id)
                        .bind(input.name.as_str())
                        .bind(input.digest.as_str())
                        .bind(body),
                )
                .await?;
            }
            Ok(())
        }
        .await;
        tx.finish(result).await
    }

    pub(super) async fn inputs_of(&self, id: &str) -> StoreResult<Vec<RunInput>> {
        let mut conn = self.reader().await?;
        self.run_exists(&mut conn, id).await?;
        let select = Sql::new(
            "SELECT name, digest, body FROM run_inputs WHERE run_id = $1 ORDER BY name, digest",
        );
        let rows = conn.fetch_all(select.bind(id)).await?;
        rows.iter().map(input_of).collect()
    }
}

/// One `run_inputs` row, which selected `name, digest, body`.
fn input_of(r: &Row) -> StoreResult<RunInput> {
    let body: String = r.col("body")?;
    Ok(RunInput {
        name: r.col("name")?,
        digest: r.col("digest")?,
        body: serde_json::from_str(&body)
            .map_err(|e| StoreError::Database(sqlx::Error::Decode(e.into())))?,
    })
}
