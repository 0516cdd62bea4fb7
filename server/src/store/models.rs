//! What the store keeps for the model registry: registered models (a unique name, a
//! description, tags, the experiment whose levels govern it), their versions (numbered per
//! model from 1, never reused; each points at the run and the checkpoint or artifact it was
//! made from) and aliases (`champion` → version 3). The MLflow registry API and Trainyard's own
//! models API both read and write these rows.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreResult;

/// A registered model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelRow {
    pub name: String,
    /// The experiment it belongs to: its levels say who may read, change and delete the model.
    pub experiment_id: String,
    pub description: String,
    pub tags: BTreeMap<String, String>,
    /// Alias → version number.
    pub aliases: BTreeMap<String, i64>,
    /// The highest version number handed out so far (0: none yet).
    pub last_version: i64,
    /// The id of the user who created it.
    pub created_by: Option<String>,
    /// That user's name.
    pub creator: Option<String>,
    /// Unix milliseconds.
    pub created_at: i64,
    pub updated_at: i64,
}

/// A new registered model.
#[derive(Debug, Clone, Default)]
pub struct NewModel {
    pub name: String,
    pub experiment_id: String,
    pub description: String,
    pub tags: BTreeMap<String, String>,
    pub created_by: Option<String>,
}

/// One version of a registered model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VersionRow {
    pub model: String,
    pub version: i64,
    /// The run it was made from.
    pub run_id: Option<String>,
    /// What it points at: `checkpoint:<directory>` of the run, or an artifact URI.
    pub source: String,
    /// `READY`: the registry copies nothing, so a version is usable once created.
    pub status: String,
    pub description: String,
    pub tags: BTreeMap<String, String>,
    /// The aliases that name this version.
    pub aliases: Vec<String>,
    /// The id of the user who created it, and that user's name.
    pub created_by: Option<String>,
    pub creator: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A new version.
#[derive(Debug, Clone, Default)]
pub struct NewVersion {
    pub run_id: Option<String>,
    pub source: String,
    pub description: String,
    pub tags: BTreeMap<String, String>,
    pub created_by: Option<String>,
}

/// Which models a listing returns.
#[derive(Debug, Clone, Default)]
pub struct ModelQuery {
    /// Only models of these experiments (the ones the caller may read); `None`: every model.
    pub experiments: Option<Vec<String>>,
    /// Exactly this name.
    pub name: Option<String>,
}

/// Which versions a listing returns.
#[derive(Debug, Clone, Default)]
pub struct VersionQuery {
    /// Only versions of models of these experiments; `None`: every one.
    pub experiments: Option<Vec<String>>,
    /// Only versions of this model.
    pub model: Option<String>,
    /// Only versions made from this run.
    pub run_id: Option<String>,
}

/// The status every version is created with.
pub const VERSION_READY: &str = "READY";

#[async_trait]
pub trait Models: Send + Sync {
    /// A conflict on `name` when a model of that name exists; not found when the experiment
    /// does not exist.
    async fn create_model(&self, new: NewModel) -> StoreResult<ModelRow>;
    async fn get_model(&self, name: &str) -> StoreResult<ModelRow>;
    /// In name order.
    async fn list_models(&self, query: &ModelQuery) -> StoreResult<Vec<ModelRow>>;
    /// A conflict on `name` when the new name is taken.
    async fn rename_model(&self, name: &str, new_name: &str) -> StoreResult<ModelRow>;
    async fn set_model_description(&self, name: &str, description: &str) -> StoreResult<()>;
    async fn set_model_tag(&self, name: &str, key: &str, value: &str) -> StoreResult<()>;
    /// Not found when the model has no such tag.
    async fn delete_model_tag(&self, name: &str, key: &str) -> StoreResult<()>;
    /// Deletes the model with its versions, tags and aliases.
    async fn delete_model(&self, name: &str) -> StoreResult<()>;

    /// The next version number of the model (one more than any it ever had).
    async fn create_version(&self, model: &str, new: NewVersion) -> StoreResult<VersionRow>;
    async fn get_version(&self, model: &str, version: i64) -> StoreResult<VersionRow>;
    /// By model name (in name order), then newest version first.
    async fn list_versions(&self, query: &VersionQuery) -> StoreResult<Vec<VersionRow>>;
    async fn set_version_description(
        &self,
        model: &str,
        version: i64,
        description: &str,
    ) -> StoreResult<()>;
    async fn set_version_tag(
        &self,
        model: &str,
        version: i64,
        key: &str,
        value: &str,
    ) -> StoreResult<()>;
    async fn delete_version_tag(&self, model: &str, version: i64, key: &str) -> StoreResult<()>;
    /// Deletes the version with its tags and the aliases that named it.
    async fn delete_version(&self, model: &str, version: i64) -> StoreResult<()>;

    /// Points the alias at the version (moving it if it named another one).
    async fn set_alias(&self, model: &str, alias: &str, version: i64) -> StoreResult<()>;
    /// Not found when the model has no such alias.
    async fn delete_alias(&self, model: &str, alias: &str) -> StoreResult<()>;
    async fn version_by_alias(&self, model: &str, alias: &str) -> StoreResult<VersionRow>;
}
