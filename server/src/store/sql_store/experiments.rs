//! Experiments: numeric ids, names, tags and soft deletion.

use std::collections::BTreeMap;

use super::SqlStore;
use crate::store::accounts::Level;
use crate::store::common;
use crate::store::sql::{Conn, Row, Sql};
use crate::store::{now_ms, Experiment, Lifecycle, StoreError, StoreResult, DEFAULT_EXPERIMENT};

/// The columns every experiment read selects, named for [`experiment`].
const EXPERIMENT_COLUMNS: &str = "e.id AS id, e.name AS name, e.created_at AS created_at, \
     COALESCE(e.updated_at, e.created_at) AS updated_at, e.deleted_at AS deleted_at";

fn experiment(row: &Row) -> Result<Experiment, sqlx::Error> {
    Ok(Experiment {
        id: row.col("id")?,
        name: row.col("name")?,
        created_at: row.col("created_at")?,
        updated_at: row.col("updated_at")?,
        deleted_at: row.col("deleted_at")?,
        tags: BTreeMap::new(),
    })
}

pub(super) fn not_found_experiment(id: &str) -> StoreError {
    StoreError::NotFound {
        entity: "experiment",
        id: id.to_string(),
    }
}

/// Attaches each experiment's tags.
async fn with_tags(
    conn: &mut Conn,
    mut experiments: Vec<Experiment>,
) -> StoreResult<Vec<Experiment>> {
    if experiments.is_empty() {
        return Ok(experiments);
    }
    let mut select =
        Sql::new("SELECT experiment_id, key, value FROM experiment_tags WHERE experiment_id IN ");
    select.tuple(experiments.iter().map(|e| e.id.clone()));
    let rows = conn.fetch_all(select).await?;
    let index: BTreeMap<String, usize> = experiments
        .iter()
        .enumerate()
        .map(|(i, e)| (e.id.clone(), i))
        .collect();
    for row in rows {
        let id: String = row.col("experiment_id")?;
        if let Some(&i) = index.get(&id) {
            experiments[i]
                .tags
                .insert(row.col("key")?, row.col("value")?);
        }
    }
    Ok(experiments)
}

/// The next experiment id: a counter in the database, so concurrent creations (several
/// server processes on one Postgres) never hand out the same number.
async fn next_id(tx: &mut Conn) -> StoreResult<String> {
    let bump =
        Sql::new("UPDATE counters SET value = value + 1 WHERE name = 'experiment' RETURNING value");
    let value: i64 = tx.fetch_one(bump).await?.col("value")?;
    Ok(value.to_string())
}

impl SqlStore {
    async fn experiment_by(&self, column: &str, value: &str) -> StoreResult<Option<Experiment>> {
        let select = Sql::new(format!(
            "SELECT {EXPERIMENT_COLUMNS} FROM experiments e WHERE e.{column} = $1"
        ));
        let mut conn = self.reader().await?;
        let Some(row) = conn.fetch_optional(select.bind(value)).await? else {
            return Ok(None);
        };
        Ok(with_tags(&mut conn, vec![experiment(&row)?]).await?.pop())
    }

    /// Inserts a new experiment (`if_absent`: a name that exists already is no error, and that
    /// experiment is returned) and returns it.
    pub(super) async fn insert_experiment_row(
        &self,
        field: &'static str,
        name: &str,
        owner_id: Option<&str>,
        default_level: Level,
        if_absent: bool,
    ) -> StoreResult<Experiment> {
        let name = common::valid_name(field, name)?;
        let conflict = if if_absent {
            " ON CONFLICT (name) DO NOTHING"
        } else {
            ""
        };
        let mut tx = self.begin_write().await?;
        let result = async {
            let id = next_id(&mut tx).await?;
            let insert = Sql::new(format!(
                "INSERT INTO experiments (id, name, created_at, owner_id, default_level) \
                 VALUES ($1, $2, $3, $4, $5){conflict}"
            ));
            tx.execute(
                insert
                    .bind(id)
                    .bind(name)
                    .bind(now_ms())
                    .bind(owner_id)
                    .bind(default_level.as_str()),
            )
            .await
            .map_err(|e| common::map_constraint(e, "name", &format!("experiment `{name}`")))?;
            Ok(())
        }
        .await;
        tx.finish(result).await?;
        self.experiment_by("name", name)
            .await?
            .ok_or_else(|| not_found_experiment(name))
    }

    pub(super) async fn find_experiment(&self, id_or_name: &str) -> StoreResult<Experiment> {
        if let Some(e) = self.experiment_by("id", id_or_name).await? {
            return Ok(e);
        }
        self.experiment_by("name", id_or_name)
            .await?
            .ok_or_else(|| not_found_experiment(id_or_name))
    }

    pub(super) async fn find_or_create_experiment(
        &self,
        id_or_name: &str,
    ) -> StoreResult<Experiment> {
        match self.find_experiment(id_or_name).await {
            Err(StoreError::NotFound { .. }) => {}
            other => return other,
        }
        self.insert_experiment_row("experiment", id_or_name, None, Level::None, true)
            .await
    }

    pub(super) async fn experiments_in(
        &self,
        lifecycle: Lifecycle,
    ) -> StoreResult<Vec<Experiment>> {
        let select = Sql::new(format!(
            "SELECT {EXPERIMENT_COLUMNS} FROM experiments e WHERE {} \
             ORDER BY e.created_at, e.id",
            lifecycle.condition("e")
        ));
        let mut conn = self.reader().await?;
        let rows = conn.fetch_all(select).await?;
        let experiments = rows.iter().map(experiment).collect::<Result<_, _>>()?;
        with_tags(&mut conn, experiments).await
    }

    /// Runs one statement that changes the experiment `id` and stamps its `updated_at`.
    async fn change_experiment(&self, id: &str, change: Sql) -> StoreResult<u64> {
        let mut tx = self.begin_write().await?;
        let result = async {
            let stamp = Sql::new("UPDATE experiments SET updated_at = $1 WHERE id = $2");
            if tx.execute(stamp.bind(now_ms()).bind(id)).await? == 0 {
                return Err(not_found_experiment(id));
            }
            Ok(tx.execute(change).await?)
        }
        .await;
        tx.finish(result).await
    }

    pub(super) async fn mark_experiment_deleted(&self, id: &str, deleted: bool) -> StoreResult<()> {
        if deleted && id == "0" {
            return Err(StoreError::Invalid {
                field: "experiment_id",
                message: format!(
                    "the {DEFAULT_EXPERIMENT} experiment (id 0) cannot be deleted: runs land there \
                     when no experiment is named"
                ),
            });
        }
        let set = if deleted {
            Sql::new("UPDATE experiments SET deleted_at = $1 WHERE id = $2 AND deleted_at IS NULL")
                .bind(now_ms())
        } else {
            Sql::new("UPDATE experiments SET deleted_at = NULL WHERE id = $1")
        };
        self.change_experiment(id, set.bind(id)).await.map(drop)
    }

    pub(super) async fn upsert_experiment_tag(
        &self,
        id: &str,
        key: &str,
        value: &str,
    ) -> StoreResult<()> {
        check_tag(key, value)?;
        let upsert = Sql::new(
            "INSERT INTO experiment_tags (experiment_id, key, value) VALUES ($1, $2, $3) \
             ON CONFLICT (experiment_id, key) DO UPDATE SET value = excluded.value",
        );
        self.change_experiment(id, upsert.bind(id).bind(key).bind(value))
            .await
            .map(drop)
    }

    pub(super) async fn remove_experiment_tag(&self, id: &str, key: &str) -> StoreResult<()> {
        let delete = Sql::new("DELETE FROM experiment_tags WHERE experiment_id = $1 AND key = $2");
        if self
            .change_experiment(id, delete.bind(id).bind(key))
            .await?
            == 0
        {
            return Err(StoreError::NotFound {
                entity: "tag",
                id: key.to_string(),
            });
        }
        Ok(())
    }

    /// Renames an experiment (its name stays unique).
    pub(super) async fn rename_experiment_row(&self, id: &str, name: &str) -> StoreResult<()> {
        let name = common::valid_name("name", name)?;
        let set = Sql::new("UPDATE experiments SET name = $1 WHERE id = $2")
            .bind(name)
            .bind(id);
        self.change_experiment(id, set)
            .await
            .map_err(|e| match e {
                StoreError::Database(db) => {
                    common::map_constraint(db, "name", &format!("experiment `{name}`"))
                }
                other => other,
            })
            .map(drop)
    }
}

/// A tag key must not be empty; neither key nor value may hold NUL.
fn check_tag(key: &str, value: &str) -> StoreResult<()> {
    let tags = BTreeMap::from([(key.to_string(), value.to_string())]);
    common::check_run_text(Some(&tags), None, None)
}
