//! `Models` for both databases: registered models, their versions, tags and aliases.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::SqlStore;
use crate::store::common;
use crate::store::models::{
    ModelQuery, ModelRow, Models, NewModel, NewVersion, VersionQuery, VersionRow, VERSION_READY,
};
use crate::store::sql::{Conn, Row, Sql};
use crate::store::{now_ms, StoreError, StoreResult};

// Each column named, so rows are read by name.
const MODEL_COLUMNS: &str = "m.id AS model_id, m.name AS name, m.experiment_id AS experiment_id, \
     m.description AS description, m.last_version AS last_version, m.created_by AS created_by, \
     m.created_at AS created_at, m.updated_at AS updated_at, \
     (SELECT u.name FROM users u WHERE u.id = m.created_by) AS creator";
const VERSION_COLUMNS: &str = "m.id AS model_id, m.name AS name, v.version AS version, \
     v.run_id AS run_id, v.source AS source, v.status AS status, v.description AS description, \
     v.created_by AS created_by, v.created_at AS created_at, v.updated_at AS updated_at, \
     (SELECT u.name FROM users u WHERE u.id = v.created_by) AS creator";

fn model_not_found(name: &str) -> StoreError {
    StoreError::NotFound {
        entity: "registered model",
        id: name.to_string(),
    }
}

fn version_not_found(model: &str, version: i64) -> StoreError {
    StoreError::NotFound {
        entity: "model version",
        id: format!("{model}/{version}"),
    }
}

/// A model row with its id (which tags, versions and aliases reference).
fn model(row: &Row) -> Result<(String, ModelRow), sqlx::Error> {
    Ok((
        row.col("model_id")?,
        ModelRow {
            name: row.col("name")?,
            experiment_id: row.col("experiment_id")?,
            description: row.col("description")?,
            last_version: row.col("last_version")?,
            created_by: row.col("created_by")?,
            created_at: row.col("created_at")?,
            updated_at: row.col("updated_at")?,
            creator: row.col("creator")?,
            tags: BTreeMap::new(),
            aliases: BTreeMap::new(),
        },
    ))
}

fn version(row: &Row) -> Result<(String, VersionRow), sqlx::Error> {
    Ok((
        row.col("model_id")?,
        VersionRow {
            model: row.col("name")?,
            version: row.col("version")?,
            run_id: row.col("run_id")?,
            source: row.col("source")?,
            status: row.col("status")?,
            description: row.col("description")?,
            created_by: row.col("created_by")?,
            created_at: row.col("created_at")?,
            updated_at: row.col("updated_at")?,
            creator: row.col("creator")?,
            tags: BTreeMap::new(),
            aliases: Vec::new(),
        },
    ))
}

/// Attaches the tags and aliases of each model.
async fn model_details(
    conn: &mut Conn,
    models: Vec<(String, ModelRow)>,
) -> StoreResult<Vec<ModelRow>> {
    if models.is_empty() {
        return Ok(Vec::new());
    }
    let index: BTreeMap<String, usize> = models
        .iter()
        .enumerate()
        .map(|(i, (id, _))| (id.clone(), i))
        .collect();
    let ids = || models.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>();
    let mut tags =
        Sql::new("SELECT model_id, key, value FROM registered_model_tags WHERE model_id IN ");
    tags.tuple(ids());
    let tag_rows = conn.fetch_all(tags).await?;
    let mut aliases =
        Sql::new("SELECT model_id, alias, version FROM model_aliases WHERE model_id IN ");
    aliases.tuple(ids());
    let alias_rows = conn.fetch_all(aliases).await?;
    let mut out: Vec<ModelRow> = models.into_iter().map(|(_, m)| m).collect();
    for row in tag_rows {
        let id: String = row.col("model_id")?;
        if let Some(&i) = index.get(&id) {
            out[i].tags.insert(row.col("key")?, row.col("value")?);
        }
    }
    for row in alias_rows {
        let id: String = row.col("model_id")?;
        if let Some(&i) = index.get(&id) {
            out[i]
                .aliases
                .insert(row.col("alias")?, row.col("version")?);
        }
    }
    Ok(out)
}

/// Attaches the tags and aliases of each version.
async fn version_details(
    conn: &mut Conn,
    versions: Vec<(String, VersionRow)>,
) -> StoreResult<Vec<VersionRow>> {
    if versions.is_empty() {
        return Ok(Vec::new());
    }
    let index: BTreeMap<(String, i64), usize> = versions
        .iter()
        .enumerate()
        .map(|(i, (id, v))| ((id.clone(), v.version), i))
        .collect();
    let mut ids: Vec<String> = versions.iter().map(|(id, _)| id.clone()).collect();
    ids.sort();
    ids.dedup();
    let mut tags =
        Sql::new("SELECT model_id, version, key, value FROM model_version_tags WHERE model_id IN ");
    tags.tuple(ids.clone());
    let tag_rows = conn.fetch_all(tags).await?;
    let mut aliases =
        Sql::new("SELECT model_id, version, alias FROM model_aliases WHERE model_id IN ");
    aliases.tuple(ids);
    aliases.push(" ORDER BY alias");
    let alias_rows = conn.fetch_all(aliases).await?;
    let mut out: Vec<VersionRow> = versions.into_iter().map(|(_, v)| v).collect();
    for row in tag_rows {
        let key: (String, i64) = (row.col("model_id")?, row.col("version")?);
        if let Some(&i) = index.get(&key) {
            out[i].tags.insert(row.col("key")?, row.col("value")?);
        }
    }
    for row in alias_rows {
        let key: (String, i64) = (row.col("model_id")?, row.col("version")?);
        if let Some(&i) = index.get(&key) {
            out[i].aliases.push(row.col("alias")?);
        }
    }
    Ok(out)
}

impl SqlStore {
    /// The id of the model with this name.
    async fn model_id(conn: &mut Conn, name: &str) -> StoreResult<String> {
        let q = Sql::new("SELECT id FROM registered_models WHERE name = $1").bind(name);
        match conn.fetch_optional(q).await? {
            Some(row) => Ok(row.col("id")?),
            None => Err(model_not_found(name)),
        }
    }

    /// Runs the statements `build` makes from the model's id in one transaction; returns the
    /// rows each changed.
    async fn model_write(
        &self,
        name: &str,
        build: impl FnOnce(&str) -> Vec<Sql> + Send,
    ) -> StoreResult<Vec<u64>> {
        let mut tx = self.begin_write().await?;
        let result = async {
            let id = Self::model_id(&mut tx, name).await?;
            let mut counts = Vec::new();
            for q in build(&id) {
                counts.push(tx.execute(q).await?);
            }
            Ok::<_, StoreError>(counts)
        }
        .await;
        tx.finish(result).await
    }

    async fn one_version(&self, conn: &mut Conn, model: &str, v: i64) -> StoreResult<VersionRow> {
        let q = Sql::new(format!(
            "SELECT {VERSION_COLUMNS} FROM model_versions v \
             JOIN registered_models m ON m.id = v.model_id \
             WHERE m.name = $1 AND v.version = $2"
        ))
        .bind(model)
        .bind(v);
        let Some(row) = conn.fetch_optional(q).await? else {
            // Which one is missing: the model, or only the version.
            Self::model_id(conn, model).await?;
            return Err(version_not_found(model, v));
        };
        version_details(conn, vec![version(&row)?])
            .await?
            .pop()
            .ok_or_else(|| version_not_found(model, v))
    }
}

#[async_trait]
impl Models for SqlStore {
    async fn create_model(&self, new: NewModel) -> StoreResult<ModelRow> {
        common::valid_name("name", &new.name)?;
        let id = common::new_id();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let result = async {
            let exists =
                Sql::new("SELECT 1 FROM experiments WHERE id = $1").bind(&new.experiment_id);
            if tx.fetch_optional(exists).await?.is_none() {
                return Err(StoreError::NotFound {
                    entity: "experiment",
                    id: new.experiment_id.clone(),
                });
            }
            let insert = Sql::new(
                "INSERT INTO registered_models (id, name, experiment_id, description, \
                 created_by, created_at, updated_at, last_version) \
                 VALUES ($1, $2, $3, $4, $5, $6, $6, 0)",
            )
            .bind(&id)
            .bind(&new.name)
            .bind(&new.experiment_id)
            .bind(&new.description)
            .bind(new.created_by.as_deref())
            .bind(now);
            tx.execute(insert).await.map_err(|e| {
                common::map_constraint(e, "name", &format!("registered model `{}`", new.name))
            })?;
            for (key, value) in &new.tags {
                let tag = Sql::new(
                    "INSERT INTO registered_model_tags (model_id, key, value) VALUES ($1, $2, $3)",
                )
                .bind(&id)
                .bind(key)
                .bind(value);
                tx.execute(tag).await?;
            }
            Ok::<_, StoreError>(())
        }
        .await;
        tx.finish(result).await?;
        self.get_model(&new.name).await
    }

    async fn get_model(&self, name: &str) -> StoreResult<ModelRow> {
        let found = self
            .list_models(&ModelQuery {
                experiments: None,
                name: Some(name.to_string()),
            })
            .await?;
        found
            .into_iter()
            .next()
            .ok_or_else(|| model_not_found(name))
    }

    async fn list_models(&self, query: &ModelQuery) -> StoreResult<Vec<ModelRow>> {
        let mut q = Sql::new(format!(
            "SELECT {MODEL_COLUMNS} FROM registered_models m WHERE 1 = 1"
        ));
        if let Some(experiments) = &query.experiments {
            if experiments.is_empty() {
                return Ok(Vec::new());
            }
            q.push(" AND m.experiment_id IN ")
                .tuple(experiments.iter().map(String::as_str));
        }
        if let Some(name) = &query.name {
            q.push(" AND m.name = ").arg(name.as_str());
        }
        q.push(&format!(" ORDER BY m.name {}", self.dialect().text_order()));
        let mut conn = self.reader().await?;
        let rows = conn.fetch_all(q).await?;
        let models = rows.iter().map(model).collect::<Result<Vec<_>, _>>()?;
        model_details(&mut conn, models).await
    }

    async fn rename_model(&self, name: &str, new_name: &str) -> StoreResult<ModelRow> {
        common::valid_name("name", new_name)?;
        let now = now_ms();
        let renamed = self
            .model_write(name, |id| {
                vec![Sql::new(
                    "UPDATE registered_models SET name = $1, updated_at = $2 WHERE id = $3",
                )
                .bind(new_name)
                .bind(now)
                .bind(id)]
            })
            .await;
        renamed.map_err(|e| match e {
            StoreError::Database(e) => {
                common::map_constraint(e, "name", &format!("registered model `{new_name}`"))
            }
            other => other,
        })?;
        self.get_model(new_name).await
    }

    async fn set_model_description(&self, name: &str, description: &str) -> StoreResult<()> {
        common::no_nul("description", description)?;
        let now = now_ms();
        self.model_write(name, |id| {
            vec![Sql::new(
                "UPDATE registered_models SET description = $1, updated_at = $2 WHERE id = $3",
            )
            .bind(description)
            .bind(now)
            .bind(id)]
        })
        .await
        .map(drop)
    }

    async fn set_model_tag(&self, name: &str, key: &str, value: &str) -> StoreResult<()> {
        let now = now_ms();
        self.model_write(name, |id| {
            vec![
                Sql::new(
                    "INSERT INTO registered_model_tags (model_id, key, value) VALUES ($1, $2, $3) \
                     ON CONFLICT (model_id, key) DO UPDATE SET value = excluded.value",
                )
                .bind(id)
                .bind(key)
                .bind(value),
                Sql::new("UPDATE registered_models SET updated_at = $1 WHERE id = $2")
                    .bind(now)
                    .bind(id),
            ]
        })
        .await
        .map(drop)
    }

    async fn delete_model_tag(&self, name: &str, key: &str) -> StoreResult<()> {
        let counts = self
            .model_write(name, |id| {
                vec![
                    Sql::new("DELETE FROM registered_model_tags WHERE model_id = $1 AND key = $2")
                        .bind(id)
                        .bind(key),
                ]
            })
            .await?;
        match counts.first() {
            Some(0) => Err(StoreError::NotFound {
                entity: "registered model tag",
                id: key.to_string(),
            }),
            _ => Ok(()),
        }
    }

    async fn delete_model(&self, name: &str) -> StoreResult<()> {
        // The children first, so the deletion does not lean on ON DELETE CASCADE.
        self.model_write(name, |id| {
            [
                "DELETE FROM model_aliases WHERE model_id = $1",
                "DELETE FROM model_version_tags WHERE model_id = $1",
                "DELETE FROM model_versions WHERE model_id = $1",
                "DELETE FROM registered_model_tags WHERE model_id = $1",
                "DELETE FROM registered_models WHERE id = $1",
            ]
            .into_iter()
            .map(|text| Sql::new(text).bind(id))
            .collect()
        })
        .await
        .map(drop)
    }

    async fn create_version(&self, model: &str, new: NewVersion) -> StoreResult<VersionRow> {
        common::no_nul("source", &new.source)?;
        common::no_nul("description", &new.description)?;
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let result = async {
            let id = Self::model_id(&mut tx, model).await?;
            // The bump locks the model's row, so racing creations get consecutive numbers.
            let bump = Sql::new(
                "UPDATE registered_models SET last_version = last_version + 1, updated_at = $2 \
                 WHERE id = $1 RETURNING last_version",
            )
            .bind(&id)
            .bind(now);
            let number: i64 = tx.fetch_one(bump).await?.col("last_version")?;
            let insert = Sql::new(
                "INSERT INTO model_versions (model_id, version, run_id, source, status, \
                 description, created_by, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
            )
            .bind(&id)
            .bind(number)
            .bind(new.run_id.as_deref())
            .bind(&new.source)
            .bind(VERSION_READY)
            .bind(&new.description)
            .bind(new.created_by.as_deref())
            .bind(now);
            tx.execute(insert).await?;
            for (key, value) in &new.tags {
                let tag = Sql::new(
                    "INSERT INTO model_version_tags (model_id, version, key, value) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(&id)
                .bind(number)
                .bind(key)
                .bind(value);
                tx.execute(tag).await?;
            }
            Ok::<_, StoreError>(number)
        }
        .await;
        let number = tx.finish(result).await?;
        self.get_version(model, number).await
    }

    async fn get_version(&self, model: &str, version: i64) -> StoreResult<VersionRow> {
        let mut conn = self.reader().await?;
        self.one_version(&mut conn, model, version).await
    }

    async fn list_versions(&self, query: &VersionQuery) -> StoreResult<Vec<VersionRow>> {
        let mut q = Sql::new(format!(
            "SELECT {VERSION_COLUMNS} FROM model_versions v \
             JOIN registered_models m ON m.id = v.model_id WHERE 1 = 1"
        ));
        if let Some(experiments) = &query.experiments {
            if experiments.is_empty() {
                return Ok(Vec::new());
            }
            q.push(" AND m.experiment_id IN ")
                .tuple(experiments.iter().map(String::as_str));
        }
        if let Some(name) = &query.model {
            q.push(" AND m.name = ").arg(name.as_str());
        }
        if let Some(run) = &query.run_id {
            q.push(" AND v.run_id = ").arg(run.as_str());
        }
        q.push(&format!(
            " ORDER BY m.name {}, v.version DESC",
            self.dialect().text_order()
        ));
        let mut conn = self.reader().await?;
        let rows = conn.fetch_all(q).await?;
        let versions = rows.iter().map(version).collect::<Result<Vec<_>, _>>()?;
        version_details(&mut conn, versions).await
    }

    async fn set_version_description(
        &self,
        model: &str,
        version: i64,
        description: &str,
    ) -> StoreResult<()> {
        common::no_nul("description", description)?;
        let now = now_ms();
        let counts = self
            .model_write(model, |id| {
                vec![Sql::new(
                    "UPDATE model_versions SET description = $1, updated_at = $2 \
                     WHERE model_id = $3 AND version = $4",
                )
                .bind(description)
                .bind(now)
                .bind(id)
                .bind(version)]
            })
            .await?;
        match counts.first() {
            Some(0) => Err(version_not_found(model, version)),
            _ => Ok(()),
        }
    }

    async fn set_version_tag(
        &self,
        model: &str,
        version: i64,
        key: &str,
        value: &str,
    ) -> StoreResult<()> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let result = async {
            let id = Self::model_id(&mut tx, model).await?;
            // The touch first: a version that does not exist changes no row, and nothing is
            // written.
            let touch = Sql::new(
                "UPDATE model_versions SET updated_at = $1 WHERE model_id = $2 AND version = $3",
            )
            .bind(now)
            .bind(&id)
            .bind(version);
            if tx.execute(touch).await? == 0 {
                return Err(version_not_found(model, version));
            }
            let upsert = Sql::new(
                "INSERT INTO model_version_tags (model_id, version, key, value) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (model_id, version, key) DO UPDATE SET value = excluded.value",
            )
            .bind(&id)
            .bind(version)
            .bind(key)
            .bind(value);
            tx.execute(upsert).await?;
            Ok::<_, StoreError>(())
        }
        .await;
        tx.finish(result).await
    }

    async fn delete_version_tag(&self, model: &str, version: i64, key: &str) -> StoreResult<()> {
        let counts = self
            .model_write(model, |id| {
                vec![Sql::new(
                    "DELETE FROM model_version_tags \
                     WHERE model_id = $1 AND version = $2 AND key = $3",
                )
                .bind(id)
                .bind(version)
                .bind(key)]
            })
            .await?;
        match counts.first() {
            Some(0) => Err(StoreError::NotFound {
                entity: "model version tag",
                id: key.to_string(),
            }),
            _ => Ok(()),
        }
    }

    async fn delete_version(&self, model: &str, version: i64) -> StoreResult<()> {
        let now = now_ms();
        let counts = self
            .model_write(model, |id| {
                let mut out: Vec<Sql> = [
                    "DELETE FROM model_aliases WHERE model_id = $1 AND version = $2",
                    "DELETE FROM model_version_tags WHERE model_id = $1 AND version = $2",
                    "DELETE FROM model_versions WHERE model_id = $1 AND version = $2",
                ]
                .into_iter()
                .map(|text| Sql::new(text).bind(id).bind(version))
                .collect();
                out.push(
                    Sql::new("UPDATE registered_models SET updated_at = $1 WHERE id = $2")
                        .bind(now)
                        .bind(id),
                );
                out
            })
            .await?;
        match counts.get(2) {
            Some(0) => Err(version_not_found(model, version)),
            _ => Ok(()),
        }
    }

    async fn set_alias(&self, model: &str, alias: &str, version: i64) -> StoreResult<()> {
        common::valid_name("alias", alias)?;
        let mut tx = self.begin_write().await?;
        let result = async {
            let id = Self::model_id(&mut tx, model).await?;
            let exists =
                Sql::new("SELECT 1 FROM model_versions WHERE model_id = $1 AND version = $2")
                    .bind(&id)
                    .bind(version);
            if tx.fetch_optional(exists).await?.is_none() {
                return Err(version_not_found(model, version));
            }
            let upsert = Sql::new(
                "INSERT INTO model_aliases (model_id, alias, version) VALUES ($1, $2, $3) \
                 ON CONFLICT (model_id, alias) DO UPDATE SET version = excluded.version",
            )
            .bind(&id)
            .bind(alias)
            .bind(version);
            tx.execute(upsert).await?;
            Ok::<_, StoreError>(())
        }
        .await;
        tx.finish(result).await
    }

    async fn delete_alias(&self, model: &str, alias: &str) -> StoreResult<()> {
        let counts = self
            .model_write(model, |id| {
                vec![
                    Sql::new("DELETE FROM model_aliases WHERE model_id = $1 AND alias = $2")
                        .bind(id)
                        .bind(alias),
                ]
            })
            .await?;
        match counts.first() {
            Some(0) => Err(StoreError::NotFound {
                entity: "model alias",
                id: format!("{model}@{alias}"),
            }),
            _ => Ok(()),
        }
    }

    async fn version_by_alias(&self, model: &str, alias: &str) -> StoreResult<VersionRow> {
        let mut conn = self.reader().await?;
        let id = Self::model_id(&mut conn, model).await?;
        let q = Sql::new("SELECT version FROM model_aliases WHERE model_id = $1 AND alias = $2")
            .bind(&id)
            .bind(alias);
        let Some(row) = conn.fetch_optional(q).await? else {
            return Err(StoreError::NotFound {
                entity: "model alias",
                id: format!("{model}@{alias}"),
            });
        };
        let number: i64 = row.col("version")?;
        self.one_version(&mut conn, model, number).await
    }
}
