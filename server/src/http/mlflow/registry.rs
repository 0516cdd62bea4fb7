//! MLflow's model registry (`registered-models/*`, `model-versions/*`): registered models,
//! their versions, tags and aliases, searches, and where a version downloads from. The rows
//! are `store::models`; the rules on sources and references `crate::registry`.
//!
//! A registered model belongs to an experiment, whose levels decide who may read (READ),
//! register versions, tag and alias it (EDIT), and delete it (MANAGE); in the shared `Default`
//! experiment, as for its runs, others need a grant to change someone's model. MLflow's create
//! names no experiment: the tag `trainyard.experiment` (an id or name) places the model, else
//! it lands in `Default`. Registering a version also needs READ on the run it comes from.

use crate::access::audit::AuditAction;
use std::collections::BTreeMap;

use axum::extract::State;
use axum::routing::{delete, get, patch, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::filter::RegistryFilter;
use super::wire::{self, KeyValue};
use super::{Caller, Fields, MlflowError, MlflowResult};
use crate::access::audit::Actor;
use crate::access::{self, Principal};
use crate::app::AppState;
use crate::registry::{self as rules, Source};
use crate::store::accounts::Level;
use crate::store::models::{ModelQuery, ModelRow, NewModel, NewVersion, VersionQuery, VersionRow};
use crate::store::{StoreError, DEFAULT_EXPERIMENT};
use crate::validate::limits::check_len;
use crate::validate::Name;

/// The tag of `registered-models/create` that names the model's experiment.
pub const EXPERIMENT_TAG: &str = "trainyard.experiment";
/// Longest description of a model or version (MLflow's limit on text fields it keeps).
const MAX_DESCRIPTION: usize = 5000;
/// Longest tag value.
const MAX_TAG_VALUE: usize = 5000;
/// Most results one search page holds when the client asks for none (MLflow's default), and at
/// most.
const DEFAULT_RESULTS: usize = 100;
const MAX_RESULTS: usize = 10_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/registered-models/create", post(create_model))
        .route("/registered-models/rename", post(rename_model))
        .route("/registered-models/update", patch(update_model))
        .route("/registered-models/delete", delete(delete_model))
        .route("/registered-models/get", get(get_model))
        .route("/registered-models/search", get(search_models))
        .route(
            "/registered-models/get-latest-versions",
            get(latest_versions).post(latest_versions),
        )
        .route("/registered-models/set-tag", post(set_model_tag))
        .route("/registered-models/delete-tag", delete(delete_model_tag))
        .route(
            "/registered-models/alias",
            get(version_by_alias).post(set_alias).delete(delete_alias),
        )
        .route("/model-versions/create", post(create_version))
        .route("/model-versions/update", patch(update_version))
        .route("/model-versions/delete", delete(delete_version))
        .route("/model-versions/get", get(get_version))
        .route("/model-versions/search", get(search_versions))
        .route("/model-versions/get-download-uri", get(download_uri))
        .route("/model-versions/set-tag", post(set_version_tag))
        .route("/model-versions/delete-tag", delete(delete_version_tag))
}

// --- the wire -------------------------------------------------------------------------------

fn version_json(v: &VersionRow) -> Value {
    let mut out = json!({
        "name": v.model,
        "version": v.version.to_string(),
        "creation_timestamp": v.created_at,
        "last_updated_timestamp": v.updated_at,
        "user_id": v.creator.clone().unwrap_or_default(),
        "current_stage": "None",
        "description": v.description,
        "source": v.source,
        "status": v.status,
        "tags": key_values(&v.tags),
        "aliases": v.aliases,
    });
    if let Some(run) = &v.run_id {
        out["run_id"] = json!(run);
    }
    out
}

fn model_json(m: &ModelRow, latest: Option<&VersionRow>) -> Value {
    json!({
        "name": m.name,
        "creation_timestamp": m.created_at,
        "last_updated_timestamp": m.updated_at,
        "user_id": m.creator.clone().unwrap_or_default(),
        "description": m.description,
        "tags": key_values(&m.tags),
        "aliases": m.aliases.iter()
            .map(|(alias, v)| json!({"alias": alias, "version": v.to_string()}))
            .collect::<Vec<_>>(),
        "latest_versions": latest.map(version_json).into_iter().collect::<Vec<_>>(),
    })
}

fn key_values(tags: &BTreeMap<String, String>) -> Vec<Value> {
    tags.iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect()
}

// --- requests -------------------------------------------------------------------------------

#[derive(Deserialize)]
struct ByName {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct ByVersion {
    #[serde(default)]
    name: String,
    #[serde(default, deserialize_with = "wire::opt_int")]
    version: Option<i64>,
}

/// A model's name: a [`Name`] without `/` or `@`, which `models:/NAME/VERSION` and
/// `model:NAME@ALIAS` references use as separators.
fn model_name(name: &str) -> MlflowResult<String> {
    let name = Name::parse("name", name)?.into_string();
    if name.contains(['/', '@']) {
        return Err(MlflowError::invalid(
            "name",
            format!("`{name}`: a model's name may not contain `/` or `@`"),
        ));
    }
    Ok(name)
}

fn version_number(version: Option<i64>) -> MlflowResult<i64> {
    match version {
        Some(v) if v > 0 => Ok(v),
        Some(v) => Err(MlflowError::invalid(
            "version",
            format!("{v} is not a version number (they start at 1)"),
        )),
        None => Err(MlflowError::invalid("version", "must be given")),
    }
}

fn check_tag(key: &str, value: &str) -> MlflowResult<()> {
    super::runs::check_key("key", key)?;
    check_len(&format!("tags.{key}"), value, MAX_TAG_VALUE)?;
    Ok(())
}

fn check_description(description: &str) -> MlflowResult<()> {
    check_len("description", description, MAX_DESCRIPTION)?;
    Ok(())
}

/// A store answer in this protocol's words: a missing model or version is
/// `RESOURCE_DOES_NOT_EXIST` naming it.
fn store_error(e: StoreError) -> MlflowError {
    match e {
        StoreError::NotFound { entity, id } => {
            MlflowError::not_found(format!("{entity} `{id}` not found"))
        }
        StoreError::Conflict { message, .. } => MlflowError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "RESOURCE_ALREADY_EXISTS",
            message,
        ),
        other => other.into(),
    }
}

/// The highest version of a model, for `latest_versions`.
async fn latest_of(state: &AppState, name: &str) -> MlflowResult<Option<VersionRow>> {
    let versions = state
        .store
        .list_versions(&VersionQuery {
            model: Some(name.to_string()),
            ..VersionQuery::default()
        })
        .await
        .map_err(store_error)?;
    Ok(versions.into_iter().next())
}

/// A page of `items`: `page_token` is the offset where it starts.
fn page<T>(
    items: Vec<T>,
    max_results: Option<usize>,
    token: Option<&str>,
) -> MlflowResult<(Vec<T>, Option<String>)> {
    let limit = max_results.unwrap_or(DEFAULT_RESULTS);
    if limit == 0 || limit > MAX_RESULTS {
        return Err(MlflowError::invalid(
            "max_results",
            format!("must be between 1 and {MAX_RESULTS}"),
        ));
    }
    let start = match token.filter(|t| !t.is_empty()) {
        Some(t) => t
            .parse::<usize>()
            .map_err(|_| MlflowError::invalid("page_token", "is not a token this server gave"))?,
        None => 0,
    };
    let total = items.len();
    let next = (start + limit < total).then(|| (start + limit).to_string());
    Ok((items.into_iter().skip(start).take(limit).collect(), next))
}

// --- registered models ----------------------------------------------------------------------

#[derive(Deserialize)]
struct CreateModel {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: Vec<KeyValue>,
}

/// The experiment a new model goes to (the `trainyard.experiment` tag, else `Default`), after
/// the caller's check: EDIT there.
async fn experiment_of_new_model(
    state: &AppState,
    principal: &Principal,
    tags: &[KeyValue],
) -> MlflowResult<String> {
    let asked = tags
        .iter()
        .find(|t| t.key == EXPERIMENT_TAG)
        .map_or(DEFAULT_EXPERIMENT, |t| t.value.as_str());
    let missing = || MlflowError::not_found(format!("experiment `{asked}` not found"));
    let experiment = match state.store.get_experiment(asked).await {
        Err(StoreError::NotFound { .. }) => return Err(missing()),
        other => other?,
    };
    access::require_experiment(state, principal, &experiment.id, asked, Level::Edit).await?;
    Ok(experiment.id)
}

async fn create_model(
    State(state): State<AppState>,
    actor: Actor,
    Fields(body): Fields<CreateModel>,
) -> MlflowResult<Json<Value>> {
    let name = model_name(&body.name)?;
    check_description(&body.description)?;
    for tag in &body.tags {
        check_tag(&tag.key, &tag.value)?;
    }
    let experiment_id = experiment_of_new_model(&state, &actor.principal, &body.tags).await?;
    let model = state
        .store
        .create_model(NewModel {
            name,
            experiment_id,
            description: body.description,
            tags: body.tags.into_iter().map(|t| (t.key, t.value)).collect(),
            created_by: actor.principal.user_id().map(str::to_owned),
        })
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelCreate,
            Some(&model.name),
            None,
        )
        .await;
    Ok(Json(json!({"registered_model": model_json(&model, None)})))
}

/// The model named, after the caller's check of the route's rule on it.
async fn model_for(state: &AppState, caller: &Caller, name: &str) -> MlflowResult<ModelRow> {
    let name = model_name(name)?;
    caller.may(state, &name).await?;
    state.store.get_model(&name).await.map_err(store_error)
}

async fn get_model(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByName>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &q.name).await?;
    let latest = latest_of(&state, &model.name).await?;
    Ok(Json(
        json!({"registered_model": model_json(&model, latest.as_ref())}),
    ))
}

#[derive(Deserialize)]
struct Rename {
    #[serde(default)]
    name: String,
    #[serde(default)]
    new_name: String,
}

async fn rename_model(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<Rename>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    let new_name = Name::parse("new_name", &body.new_name)?;
    let renamed = if new_name.as_str() == model.name {
        model
    } else {
        let renamed = state
            .store
            .rename_model(&model.name, new_name.as_str())
            .await
            .map_err(store_error)?;
        actor
            .record(
                state.store.as_ref(),
                AuditAction::ModelRename,
                Some(&renamed.name),
                Some(format!("from {}", model.name)),
            )
            .await;
        renamed
    };
    Ok(Json(
        json!({"registered_model": model_json(&renamed, None)}),
    ))
}

#[derive(Deserialize)]
struct Describe {
    #[serde(default)]
    name: String,
    #[serde(default, deserialize_with = "wire::opt_int")]
    version: Option<i64>,
    #[serde(default)]
    description: String,
}

async fn update_model(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Describe>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    check_description(&body.description)?;
    state
        .store
        .set_model_description(&model.name, &body.description)
        .await
        .map_err(store_error)?;
    let model = state
        .store
        .get_model(&model.name)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({"registered_model": model_json(&model, None)})))
}

async fn delete_model(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<ByName>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    state
        .store
        .delete_model(&model.name)
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelDelete,
            Some(&model.name),
            None,
        )
        .await;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
struct Search {
    #[serde(default)]
    filter: String,
    #[serde(default, deserialize_with = "wire::opt_usize")]
    max_results: Option<usize>,
    #[serde(default)]
    page_token: Option<String>,
    #[serde(default, deserialize_with = "wire::strings")]
    order_by: Vec<String>,
}

/// The experiments whose models the caller may read (`None`: all).
async fn readable(state: &AppState, principal: &Principal) -> MlflowResult<Option<Vec<String>>> {
    Ok(access::experiments_at(state.store.as_ref(), principal, Level::Read).await?)
}

/// Registry searches sort by name (and versions newest first); any other order is refused.
fn check_order(order_by: &[String], allowed: &[&str]) -> MlflowResult<bool> {
    let mut descending = false;
    for entry in order_by {
        let mut words = entry.split_whitespace();
        let field = words.next().unwrap_or_default();
        let field = field.strip_prefix("attributes.").unwrap_or(field);
        let dir = words.next().map(str::to_ascii_uppercase);
        if !allowed.contains(&field) || !matches!(dir.as_deref(), None | Some("ASC" | "DESC")) {
            return Err(MlflowError::invalid(
                "order_by",
                format!(
                    "`{entry}`: this server sorts by {} only",
                    allowed.join(", ")
                ),
            ));
        }
        descending = dir.as_deref() == Some("DESC");
    }
    Ok(descending)
}

async fn search_models(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Search>,
) -> MlflowResult<Json<Value>> {
    let filter = RegistryFilter::models(&q.filter)?;
    let descending = check_order(&q.order_by, &["name"])?;
    let query = ModelQuery {
        experiments: readable(&state, &caller.principal).await?,
        name: filter.exact_name(),
    };
    let mut models: Vec<ModelRow> = state
        .store
        .list_models(&query)
        .await
        .map_err(store_error)?
        .into_iter()
        .filter(|m| filter.matches_model(m))
        .collect();
    if descending {
        models.reverse();
    }
    let (models, next) = page(models, q.max_results, q.page_token.as_deref())?;
    let mut out = Vec::with_capacity(models.len());
    for m in &models {
        let latest = latest_of(&state, &m.name).await?;
        out.push(model_json(m, latest.as_ref()));
    }
    let mut body = json!({"registered_models": out});
    if let Some(token) = next {
        body["next_page_token"] = json!(token);
    }
    Ok(Json(body))
}

async fn latest_versions(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByName>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &q.name).await?;
    let latest = latest_of(&state, &model.name).await?;
    Ok(Json(
        json!({"model_versions": latest.iter().map(version_json).collect::<Vec<_>>()}),
    ))
}

#[derive(Deserialize)]
struct Tag {
    #[serde(default)]
    name: String,
    #[serde(default, deserialize_with = "wire::opt_int")]
    version: Option<i64>,
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

async fn set_model_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    check_tag(&body.key, &body.value)?;
    state
        .store
        .set_model_tag(&model.name, &body.key, &body.value)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({})))
}

async fn delete_model_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    state
        .store
        .delete_model_tag(&model.name, &body.key)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({})))
}

// --- aliases --------------------------------------------------------------------------------

#[derive(Deserialize)]
struct Alias {
    #[serde(default)]
    name: String,
    #[serde(default)]
    alias: String,
    #[serde(default, deserialize_with = "wire::opt_int")]
    version: Option<i64>,
}

fn alias_name(alias: &str) -> MlflowResult<String> {
    let parsed = Name::parse("alias", alias)?;
    // `latest` and `v<number>` read as versions in `models:/` URIs; MLflow refuses them too.
    let reserved = parsed.as_str().eq_ignore_ascii_case("latest")
        || parsed
            .as_str()
            .strip_prefix(['v', 'V'])
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    if reserved {
        return Err(MlflowError::invalid(
            "alias",
            format!("`{alias}` is reserved: `latest` and v<number> name versions"),
        ));
    }
    Ok(parsed.into_string())
}

async fn set_alias(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<Alias>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    let alias = alias_name(&body.alias)?;
    let version = version_number(body.version)?;
    state
        .store
        .set_alias(&model.name, &alias, version)
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelAlias,
            Some(&model.name),
            Some(format!("{alias} -> version {version}")),
        )
        .await;
    Ok(Json(json!({})))
}

async fn delete_alias(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<Alias>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    state
        .store
        .delete_alias(&model.name, &body.alias)
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelUnalias,
            Some(&model.name),
            Some(body.alias.clone()),
        )
        .await;
    Ok(Json(json!({})))
}

async fn version_by_alias(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Alias>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &q.name).await?;
    let version = state
        .store
        .version_by_alias(&model.name, &q.alias)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({"model_version": version_json(&version)})))
}

// --- versions -------------------------------------------------------------------------------

#[derive(Deserialize)]
struct CreateVersion {
    #[serde(default)]
    name: String,
    #[serde(default)]
    source: String,
    #[serde(default)]
    run_id: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: Vec<KeyValue>,
}

/// A version's source, and the run it comes from, after the caller's check: READ on that run.
/// A source naming a run's artifacts names the run; `run_id`, when given too, must be the same.
async fn checked_source(
    state: &AppState,
    principal: &Principal,
    source: &str,
    run_id: Option<&str>,
) -> MlflowResult<(Source, String)> {
    let parsed = rules::parse_source("source", source)?;
    let run_id = match (&parsed, run_id.filter(|r| !r.is_empty())) {
        (Source::RunArtifacts { run_id: named, .. }, Some(given)) if named != given => {
            return Err(MlflowError::invalid(
                "run_id",
                format!("`{given}` is not the run the source names (`{named}`)"),
            ))
        }
        (Source::RunArtifacts { run_id, .. }, _) => run_id.clone(),
        (Source::Checkpoint { .. }, Some(given)) => given.to_string(),
        (Source::Checkpoint { .. }, None) => {
            return Err(MlflowError::invalid(
                "run_id",
                "a checkpoint source needs the run it belongs to",
            ))
        }
    };
    access::require_run(state, principal, &run_id, Level::Read).await?;
    Ok((parsed, run_id))
}

async fn create_version(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<CreateVersion>,
) -> MlflowResult<Json<Value>> {
    let model = model_for(&state, &caller, &body.name).await?;
    check_description(&body.description)?;
    for tag in &body.tags {
        check_tag(&tag.key, &tag.value)?;
    }
    let (_, run_id) = checked_source(
        &state,
        &actor.principal,
        &body.source,
        body.run_id.as_deref(),
    )
    .await?;
    let version = state
        .store
        .create_version(
            &model.name,
            NewVersion {
                run_id: Some(run_id.clone()),
                source: body.source,
                description: body.description,
                tags: body.tags.into_iter().map(|t| (t.key, t.value)).collect(),
                created_by: actor.principal.user_id().map(str::to_owned),
            },
        )
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelVersionCreate,
            Some(&format!("{}/{}", version.model, version.version)),
            Some(format!("from run {run_id}")),
        )
        .await;
    Ok(Json(json!({"model_version": version_json(&version)})))
}

async fn version_for(
    state: &AppState,
    caller: &Caller,
    name: &str,
    version: Option<i64>,
) -> MlflowResult<VersionRow> {
    let model = model_for(state, caller, name).await?;
    let number = version_number(version)?;
    state
        .store
        .get_version(&model.name, number)
        .await
        .map_err(store_error)
}

async fn get_version(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByVersion>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &q.name, q.version).await?;
    Ok(Json(json!({"model_version": version_json(&version)})))
}

async fn update_version(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Describe>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &body.name, body.version).await?;
    check_description(&body.description)?;
    state
        .store
        .set_version_description(&version.model, version.version, &body.description)
        .await
        .map_err(store_error)?;
    let version = state
        .store
        .get_version(&version.model, version.version)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({"model_version": version_json(&version)})))
}

async fn delete_version(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<ByVersion>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &body.name, body.version).await?;
    state
        .store
        .delete_version(&version.model, version.version)
        .await
        .map_err(store_error)?;
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ModelVersionDelete,
            Some(&format!("{}/{}", version.model, version.version)),
            None,
        )
        .await;
    Ok(Json(json!({})))
}

async fn search_versions(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Search>,
) -> MlflowResult<Json<Value>> {
    let filter = RegistryFilter::versions(&q.filter)?;
    check_order(&q.order_by, &["name", "version_number"])?;
    let query = VersionQuery {
        experiments: readable(&state, &caller.principal).await?,
        model: filter.exact_name(),
        run_id: None,
    };
    let versions: Vec<VersionRow> = state
        .store
        .list_versions(&query)
        .await
        .map_err(store_error)?
        .into_iter()
        .filter(|v| filter.matches_version(v))
        .collect();
    let (versions, next) = page(versions, q.max_results, q.page_token.as_deref())?;
    let mut body = json!({"model_versions": versions.iter().map(version_json).collect::<Vec<_>>()});
    if let Some(token) = next {
        body["next_page_token"] = json!(token);
    }
    Ok(Json(body))
}

async fn download_uri(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByVersion>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &q.name, q.version).await?;
    let source = rules::parse_source("source", &version.source)?;
    let experiment_id = match &source {
        Source::RunArtifacts { run_id, .. } => {
            state
                .store
                .get_run(run_id)
                .await
                .map_err(store_error)?
                .experiment_id
        }
        Source::Checkpoint { .. } => String::new(),
    };
    let uri = rules::download_uri(&source, &experiment_id).ok_or_else(|| {
        MlflowError::invalid(
            "version",
            format!(
                "version {} of `{}` is a checkpoint ({}): download it from Trainyard's API \
                 (GET /api/v1/runs/<run>/checkpoints/<name>/archive), not as MLflow artifacts",
                version.version, version.model, version.source
            ),
        )
    })?;
    Ok(Json(json!({"artifact_uri": uri})))
}

async fn set_version_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &body.name, body.version).await?;
    check_tag(&body.key, &body.value)?;
    state
        .store
        .set_version_tag(&version.model, version.version, &body.key, &body.value)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({})))
}

async fn delete_version_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let version = version_for(&state, &caller, &body.name, body.version).await?;
    state
        .store
        .delete_version_tag(&version.model, version.version, &body.key)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({})))
}
