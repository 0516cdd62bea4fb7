//! `experiments/*`: create, read, search, rename, tag, delete and restore.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::filter::{experiment_order, ExperimentFilter};
use super::wire::{self, KeyValue};
use super::{Caller, Fields, MlflowError, MlflowResult};
use crate::access::audit::Actor;
use crate::access::audit::AuditAction;
use crate::app::AppState;
use crate::store::{Experiment, Lifecycle, SortDir, StoreError};
use crate::validate::limits::check_len;
use crate::validate::Name;

/// Longest experiment tag value (MLflow's limit).
const MAX_EXPERIMENT_TAG_VALUE: usize = 20_000;
/// Most results one search page may ask for (MLflow's limit).
pub const MAX_RESULTS_LIMIT: usize = 50_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/experiments/create", post(create))
        .route("/experiments/get", get(get_one))
        .route("/experiments/get-by-name", get(get_by_name))
        .route("/experiments/search", get(search).post(search))
        .route("/experiments/update", post(update))
        .route("/experiments/delete", post(delete))
        .route("/experiments/restore", post(restore))
        .route("/experiments/set-experiment-tag", post(set_tag))
        .route("/experiments/delete-experiment-tag", post(delete_tag))
}

#[derive(Deserialize)]
struct Create {
    #[serde(default)]
    name: String,
    #[serde(default)]
    artifact_location: Option<String>,
    #[serde(default)]
    tags: Vec<KeyValue>,
}

fn check_tag(key: &str, value: &str) -> MlflowResult<()> {
    Name::parse("key", key)?;
    check_len(&format!("tags.{key}"), value, MAX_EXPERIMENT_TAG_VALUE)?;
    Ok(())
}

async fn create(
    State(state): State<AppState>,
    actor: Actor,
    Fields(body): Fields<Create>,
) -> MlflowResult<Json<Value>> {
    let name = Name::parse("name", &body.name)?;
    if body
        .artifact_location
        .as_deref()
        .is_some_and(|l| !l.is_empty())
    {
        return Err(MlflowError::invalid(
            "artifact_location",
            "this server keeps artifacts itself (under mlflow-artifacts:/<experiment id>); \
             leave artifact_location out",
        ));
    }
    for tag in &body.tags {
        check_tag(&tag.key, &tag.value)?;
    }
    let experiment = state
        .store
        .create_experiment_owned(
            name.as_str(),
            actor.principal.user_id(),
            state.settings.default_level,
        )
        .await?;
    for tag in &body.tags {
        state
            .store
            .set_experiment_tag(&experiment.id, &tag.key, &tag.value)
            .await?;
    }
    actor
        .record(
            state.store.as_ref(),
            AuditAction::ExperimentCreate,
            Some(&experiment.id),
            None,
        )
        .await;
    Ok(Json(json!({"experiment_id": experiment.id})))
}

#[derive(Deserialize)]
struct ById {
    #[serde(default)]
    experiment_id: String,
}

/// The experiment with exactly this id (not a name), after the caller's access check.
pub async fn by_id(state: &AppState, caller: &Caller, id: &str) -> MlflowResult<Experiment> {
    if id.is_empty() {
        return Err(MlflowError::invalid("experiment_id", "must be given"));
    }
    let missing = || MlflowError::not_found(format!("experiment `{id}` not found"));
    caller.may(state, id).await?;
    match state.store.get_experiment(id).await {
        Ok(e) if e.id == id => Ok(e),
        Ok(_) | Err(StoreError::NotFound { .. }) => Err(missing()),
        Err(e) => Err(e.into()),
    }
}

async fn get_one(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ById>,
) -> MlflowResult<Json<Value>> {
    let e = by_id(&state, &caller, &q.experiment_id).await?;
    Ok(Json(json!({"experiment": wire::experiment(&e)})))
}

#[derive(Deserialize)]
struct ByName {
    #[serde(default)]
    experiment_name: String,
}

async fn get_by_name(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<ByName>,
) -> MlflowResult<Json<Value>> {
    let name = q.experiment_name.trim();
    if name.is_empty() {
        return Err(MlflowError::invalid("experiment_name", "must be given"));
    }
    let missing = || MlflowError::not_found(format!("experiment `{name}` not found"));
    // Deleted experiments too: the client refuses to use one by name, with its own message.
    let found = match state.store.get_experiment(name).await {
        Ok(e) if e.name == name => Some(e),
        Ok(_) | Err(StoreError::NotFound { .. }) => state
            .store
            .list_experiments(Lifecycle::All)
            .await?
            .into_iter()
            .find(|e| e.name == name),
        Err(e) => return Err(e.into()),
    };
    let e = found.ok_or_else(missing)?;
    caller.may(&state, &e.id).await.map_err(|_| missing())?;
    Ok(Json(json!({"experiment": wire::experiment(&e)})))
}

#[derive(Deserialize)]
struct Search {
    #[serde(default, deserialize_with = "wire::opt_usize")]
    max_results: Option<usize>,
    #[serde(default)]
    page_token: Option<String>,
    #[serde(default)]
    filter: Option<String>,
    #[serde(default, deserialize_with = "wire::strings")]
    order_by: Vec<String>,
    #[serde(default)]
    view_type: Option<String>,
}

/// MLflow's view types, by name or number.
pub fn lifecycle(field: &str, view: Option<&str>) -> MlflowResult<Lifecycle> {
    Ok(match view.unwrap_or("ACTIVE_ONLY") {
        "ACTIVE_ONLY" | "1" | "" => Lifecycle::Active,
        "DELETED_ONLY" | "2" => Lifecycle::Deleted,
        "ALL" | "3" => Lifecycle::All,
        other => {
            return Err(MlflowError::invalid(
                field,
                format!("`{other}` is not ACTIVE_ONLY, DELETED_ONLY or ALL"),
            ))
        }
    })
}

/// A page size: 1 to 50,000, `default` when absent.
pub fn page_size(asked: Option<usize>, default: usize) -> MlflowResult<usize> {
    match asked {
        None => Ok(default),
        Some(n) if (1..=MAX_RESULTS_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(MlflowError::invalid(
            "max_results",
            format!("{n} is not between 1 and {MAX_RESULTS_LIMIT}"),
        )),
    }
}

async fn search(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Search>,
) -> MlflowResult<Json<Value>> {
    let view = lifecycle("view_type", q.view_type.as_deref())?;
    let size = page_size(q.max_results, 1000)?;
    let filter = ExperimentFilter::parse(q.filter.as_deref().unwrap_or(""))?;
    let mut order = q
        .order_by
        .iter()
        .map(|o| experiment_order(o))
        .collect::<MlflowResult<Vec<_>>>()?;
    if order.is_empty() {
        order.push(("creation_time".into(), SortDir::Desc));
    }
    order.push(("experiment_id".into(), SortDir::Asc));
    // The page token is the offset of the page's first experiment (experiments are few).
    let offset = match q.page_token.as_deref().filter(|t| !t.is_empty()) {
        None => 0,
        Some(t) => t
            .parse::<usize>()
            .map_err(|_| MlflowError::invalid("page_token", "not a token this server gave"))?,
    };
    let mut experiments = state.store.list_experiments(view).await?;
    crate::access::retain_readable(state.store.as_ref(), &caller.principal, &mut experiments)
        .await?;
    experiments.retain(|e| filter.matches(e));
    experiments.sort_by(|a, b| {
        for (key, dir) in &order {
            let ord = match key.as_str() {
                "name" => a.name.cmp(&b.name),
                "experiment_id" => numeric_id(&a.id).cmp(&numeric_id(&b.id)),
                "creation_time" => a.created_at.cmp(&b.created_at),
                _ => a.updated_at.cmp(&b.updated_at),
            };
            let ord = if *dir == SortDir::Desc {
                ord.reverse()
            } else {
                ord
            };
            if ord.is_ne() {
                return ord;
            }
        }
        std::cmp::Ordering::Equal
    });
    let page: Vec<Value> = experiments
        .iter()
        .skip(offset)
        .take(size)
        .map(wire::experiment)
        .collect();
    let mut out = json!({"experiments": page});
    if offset + size < experiments.len() {
        out["next_page_token"] = json!((offset + size).to_string());
    }
    Ok(Json(out))
}

/// Ids are numbers; one that is not (never made here) sorts after them by its text.
fn numeric_id(id: &str) -> (u64, &str) {
    (id.parse().unwrap_or(u64::MAX), id)
}

#[derive(Deserialize)]
struct Update {
    #[serde(default)]
    experiment_id: String,
    #[serde(default)]
    new_name: String,
}

async fn update(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Update>,
) -> MlflowResult<Json<Value>> {
    let e = by_id(&state, &caller, &body.experiment_id).await?;
    let name = Name::parse("new_name", &body.new_name)?;
    state.store.rename_experiment(&e.id, name.as_str()).await?;
    Ok(Json(json!({})))
}

async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<ById>,
) -> MlflowResult<Json<Value>> {
    mark_deleted(&state, &caller, &actor, &body.experiment_id, true).await
}

async fn restore(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<ById>,
) -> MlflowResult<Json<Value>> {
    mark_deleted(&state, &caller, &actor, &body.experiment_id, false).await
}

/// Soft deletion (`deleted`) or restoration of an experiment, recorded in the audit log.
async fn mark_deleted(
    state: &AppState,
    caller: &Caller,
    actor: &Actor,
    id: &str,
    deleted: bool,
) -> MlflowResult<Json<Value>> {
    let e = by_id(state, caller, id).await?;
    state.store.set_experiment_deleted(&e.id, deleted).await?;
    let action = if deleted {
        AuditAction::ExperimentDelete
    } else {
        AuditAction::ExperimentRestore
    };
    actor
        .record(state.store.as_ref(), action, Some(&e.id), None)
        .await;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
struct Tag {
    #[serde(default)]
    experiment_id: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

async fn set_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let e = by_id(&state, &caller, &body.experiment_id).await?;
    check_tag(&body.key, &body.value)?;
    state
        .store
        .set_experiment_tag(&e.id, &body.key, &body.value)
        .await?;
    Ok(Json(json!({})))
}

async fn delete_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Tag>,
) -> MlflowResult<Json<Value>> {
    let e = by_id(&state, &caller, &body.experiment_id).await?;
    state.store.delete_experiment_tag(&e.id, &body.key).await?;
    Ok(Json(json!({})))
}
