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

mod aliases;
mod models;
mod versions;

use aliases::*;
use models::*;
use versions::*;

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

// --- what models and versions share in their requests ------------------------------------

#[derive(Deserialize)]
struct Describe {
    #[serde(default)]
    name: String,
    #[serde(default, deserialize_with = "wire::opt_int")]
    version: Option<i64>,
    #[serde(default)]
    description: String,
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

// --- searches -------------------------------------------------------------------------------

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

/// A search's answer: the page of `items` under `key`, and the next page's token if any.
fn paged(key: &str, items: Vec<Value>, next: Option<String>) -> Json<Value> {
    let mut body = json!({ key: items });
    if let Some(token) = next {
        body["next_page_token"] = json!(token);
    }
    Json(body)
}
