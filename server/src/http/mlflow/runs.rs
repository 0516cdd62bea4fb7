//! `runs/*`: create, read, update (status, name), delete and restore, search, and what a client
//! logs besides metrics: params, tags, dataset inputs.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::experiments::{by_id, lifecycle, page_size};
use super::filter::{run_filter, run_order};
use super::wire::{self, KeyValue, MlflowStatus, NOTE_TAG, RUN_NAME_TAG};
use super::{Caller, Fields, MlflowError, MlflowResult};
use crate::access::audit::Actor;
use crate::access::audit::AuditAction;
use crate::app::AppState;
use crate::status::{change_status, Actor as StatusActor};
use crate::store::accounts::RunAccess;
use crate::store::{Run, RunQuery, RunUpdate, SortDir, SortKey, StoreError};
use crate::validate::limits::{check_len, MAX_NOTES_LEN};
use crate::validate::Name;

/// Longest param value and tag value (MLflow's limits; its client truncates to them).
pub const MAX_PARAM_VALUE: usize = 6_000;
pub const MAX_TAG_VALUE: usize = 8_000;
/// Longest param, tag or metric key.
pub const MAX_KEY: usize = 250;
/// Most runs one search page returns (a client asking for more gets a next page token).
const SEARCH_PAGE: usize = 1_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs/create", post(create))
        .route("/runs/get", get(get_one))
        .route("/runs/update", post(update))
        .route("/runs/delete", post(delete))
        .route("/runs/restore", post(restore))
        .route("/runs/search", get(search).post(search))
        .route("/runs/log-parameter", post(log_parameter))
        .route("/runs/set-tag", post(set_tag))
        .route("/runs/delete-tag", post(delete_tag))
        .route("/runs/log-inputs", post(log_inputs))
}

/// The run a request names (`run_id`, or the older `run_uuid`).
#[derive(Deserialize, Default)]
pub struct RunRef {
    #[serde(default)]
    pub run_id: String,
    #[serde(default)]
    pub run_uuid: String,
}

impl RunRef {
    pub fn id(&self) -> MlflowResult<&str> {
        match (self.run_id.as_str(), self.run_uuid.as_str()) {
            ("", "") => Err(MlflowError::invalid("run_id", "must be given")),
            ("", id) | (id, _) => Ok(id),
        }
    }
}

/// The run, after the caller's access check for this route.
pub async fn run_for(state: &AppState, caller: &Caller, id: &str) -> MlflowResult<Run> {
    caller.may(state, id).await?;
    Ok(state.store.get_run(id).await?)
}

/// The access check for a run that is to take data, and that it is not deleted; without
/// loading the run (metric batches come through here).
pub async fn loggable(state: &AppState, caller: &Caller, id: &str) -> MlflowResult<RunAccess> {
    caller.may(state, id).await?;
    let access = state.store.run_access(id).await?;
    if access.deleted {
        return Err(deleted(id));
    }
    Ok(access)
}

fn deleted(id: &str) -> MlflowError {
    MlflowError::invalid(
        "run_id",
        format!("run `{id}` is deleted: restore it before logging to it"),
    )
}

/// A deleted run takes no more data until it is restored (as in MLflow).
pub fn active(run: &Run) -> MlflowResult<()> {
    if run.deleted_at.is_some() {
        return Err(deleted(&run.id));
    }
    Ok(())
}

/// A key of a param, tag or metric: non-empty, one line, at most 250 bytes.
pub fn check_key(field: &str, key: &str) -> MlflowResult<()> {
    if key.is_empty() {
        return Err(MlflowError::invalid(field, "a key must not be empty"));
    }
    check_len(field, key, MAX_KEY)?;
    if key.chars().any(char::is_control) {
        return Err(MlflowError::invalid(
            field,
            format!("key `{key}` must not contain control characters"),
        ));
    }
    Ok(())
}

fn check_value(field: &str, value: &str, max: usize) -> MlflowResult<()> {
    check_len(field, value, max)?;
    if value.contains('\0') {
        return Err(MlflowError::invalid(
            field,
            "must not contain NUL characters",
        ));
    }
    Ok(())
}

pub fn check_param(p: &KeyValue) -> MlflowResult<()> {
    check_key("params.key", &p.key)?;
    check_value(&format!("params.{}", p.key), &p.value, MAX_PARAM_VALUE)
}

pub fn check_tag(t: &KeyValue) -> MlflowResult<()> {
    check_key("tags.key", &t.key)?;
    let max = if t.key == NOTE_TAG {
        MAX_NOTES_LEN
    } else {
        MAX_TAG_VALUE
    };
    check_value(&format!("tags.{}", t.key), &t.value, max)?;
    if t.key == RUN_NAME_TAG {
        Name::parse("tags.mlflow.runName", &t.value)?;
    }
    Ok(())
}

/// Tags as a run update: `mlflow.runName` renames the run and `mlflow.note.content` is its
/// notes; the rest are tags. All are checked first.
fn tags_update(tags: &[KeyValue]) -> MlflowResult<RunUpdate> {
    let mut update = RunUpdate::default();
    let mut plain = BTreeMap::new();
    for tag in tags {
        check_tag(tag)?;
        match tag.key.as_str() {
            RUN_NAME_TAG => update.name = Some(tag.value.trim().to_string()),
            NOTE_TAG => update.notes = Some(tag.value.clone()),
            _ => {
                plain.insert(tag.key.clone(), tag.value.clone());
            }
        }
    }
    if !plain.is_empty() {
        update.tags = Some(plain);
    }
    Ok(update)
}

/// Applies tags (see [`tags_update`]).
pub async fn apply_tags(state: &AppState, run_id: &str, tags: &[KeyValue]) -> MlflowResult<()> {
    if tags.is_empty() {
        return Ok(());
    }
    state.store.update_run(run_id, tags_update(tags)?).await?;
    Ok(())
}

#[derive(Deserialize)]
struct Create {
    #[serde(default)]
    experiment_id: Option<String>,
    #[serde(default)]
    run_name: Option<String>,
    #[serde(default)]
    tags: Vec<KeyValue>,
    /// The client's start time (unix ms), kept as the run's start.
    #[serde(default, deserialize_with = "wire::opt_int")]
    start_time: Option<i64>,
}

async fn create(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<Create>,
) -> MlflowResult<Json<Value>> {
    let experiment_id = body
        .experiment_id
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "0".to_string());
    let experiment = by_id(&state, &caller, &experiment_id).await?;
    let now = crate::store::now_ms();
    let start_time = body
        .start_time
        .map(|t| crate::validate::times::client_time("start_time", t, now))
        .transpose()?;
    let mut update = tags_update(&body.tags)?;
    let name = match body
        .run_name
        .filter(|n| !n.trim().is_empty())
        .or(update.name.take())
    {
        Some(n) => Some(Name::parse("run_name", &n)?.into_string()),
        None => None,
    };
    let tracked = crate::actions::TrackedRun {
        experiment_id: experiment.id,
        name,
        tags: update.tags.take().unwrap_or_default(),
        notes: update.notes.take(),
        started: Some("started by an MLflow client"),
        ..Default::default()
    };
    let mut run = crate::actions::create_run(&state, &actor, tracked).await?;
    if start_time.is_some() {
        state.store.set_run_times(&run.id, start_time, None).await?;
        run = state.store.get_run(&run.id).await?;
    }
    Ok(Json(json!({"run": wire::run(&run, &[])})))
}

async fn get_one(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<RunRef>,
) -> MlflowResult<Json<Value>> {
    let run = run_for(&state, &caller, q.id()?).await?;
    let inputs = state.store.run_inputs(&run.id).await?;
    Ok(Json(json!({"run": wire::run(&run, &inputs)})))
}

#[derive(Deserialize)]
struct Update {
    #[serde(flatten)]
    run: RunRef,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    run_name: Option<String>,
    /// The client's end time (unix ms), kept as the run's end when this update ends it.
    #[serde(default, deserialize_with = "wire::opt_int")]
    end_time: Option<i64>,
}

async fn update(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<Update>,
) -> MlflowResult<Json<Value>> {
    let id = body.run.id()?;
    let run = loggable(&state, &caller, id).await?;
    // An unknown status name leaves the status as it is, as MLflow's client does when it
    // reads one.
    let wanted = body.status.as_deref().and_then(MlflowStatus::parse);
    let end_time = body
        .end_time
        .map(|t| crate::validate::times::client_time("end_time", t, crate::store::now_ms()))
        .transpose()?;
    if let Some(name) = body.run_name.as_deref().filter(|n| !n.trim().is_empty()) {
        let name = Name::parse("run_name", name)?;
        let rename = RunUpdate {
            name: Some(name.into_string()),
            ..RunUpdate::default()
        };
        state.store.update_run(id, rename).await?;
    }
    // An ended run reported ended again (say FINISHED after `set_terminated(..., "KILLED")`)
    // keeps the end it was first given: Trainyard's lifecycle has no change between ends.
    if let Some(to) = wanted.and_then(MlflowStatus::target) {
        if to != run.status && !(run.status.is_terminal() && to.is_terminal()) {
            change_status(
                state.store.as_ref(),
                &state.live,
                id,
                to,
                Some("reported by an MLflow client"),
                None,
                StatusActor::Client,
            )
            .await?;
            if to.is_terminal() && end_time.is_some() {
                state.store.set_run_times(id, None, end_time).await?;
            }
        }
    }
    crate::liveness::seen(&state, id).await?;
    let run = state.store.get_run(id).await?;
    Ok(Json(json!({"run_info": wire::run_info(&run)})))
}

async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<RunRef>,
) -> MlflowResult<Json<Value>> {
    mark_deleted(&state, &caller, &actor, body.id()?, true).await
}

async fn restore(
    State(state): State<AppState>,
    caller: Caller,
    actor: Actor,
    Fields(body): Fields<RunRef>,
) -> MlflowResult<Json<Value>> {
    mark_deleted(&state, &caller, &actor, body.id()?, false).await
}

/// Soft deletion (`deleted`) or restoration of a run, recorded in the audit log.
async fn mark_deleted(
    state: &AppState,
    caller: &Caller,
    actor: &Actor,
    id: &str,
    deleted: bool,
) -> MlflowResult<Json<Value>> {
    caller.may(state, id).await?;
    state.store.set_run_deleted(id, deleted).await?;
    let action = if deleted {
        AuditAction::RunSoftDelete
    } else {
        AuditAction::RunRestore
    };
    actor
        .record(state.store.as_ref(), action, Some(id), None)
        .await;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
struct Search {
    #[serde(default, deserialize_with = "wire::strings")]
    experiment_ids: Vec<String>,
    #[serde(default)]
    filter: Option<String>,
    #[serde(default)]
    run_view_type: Option<String>,
    #[serde(default, deserialize_with = "wire::opt_usize")]
    max_results: Option<usize>,
    #[serde(default, deserialize_with = "wire::strings")]
    order_by: Vec<String>,
    #[serde(default)]
    page_token: Option<String>,
}

async fn search(
    State(state): State<AppState>,
    caller: Caller,
    Fields(q): Fields<Search>,
) -> MlflowResult<Json<Value>> {
    let view = lifecycle("run_view_type", q.run_view_type.as_deref())?;
    let size = page_size(q.max_results, 1000)?;
    let filter = run_filter(q.filter.as_deref().unwrap_or(""))?;
    let (sort, dir) = match q.order_by.as_slice() {
        [] => (SortKey::CreatedAt, SortDir::Desc),
        [one] => run_order(one)?,
        [_, more, ..] => {
            return Err(MlflowError::invalid(
                "order_by",
                format!(
                    "this server sorts by one key (then by start time); `{more}` is a second one"
                ),
            ))
        }
    };
    if q.experiment_ids.is_empty() {
        return Ok(Json(json!({})));
    }
    let mut experiments = q.experiment_ids;
    if let Some(readable) = caller
        .principal
        .readable_experiments(state.store.as_ref())
        .await?
    {
        experiments.retain(|e| readable.contains(e));
    }
    let query = RunQuery {
        experiment_id: None,
        status: None,
        tag: None,
        filter,
        sort,
        dir,
        limit: size.min(SEARCH_PAGE),
        cursor: q.page_token.filter(|t| !t.is_empty()),
        visible_experiments: Some(experiments),
        lifecycle: view,
    };
    let page = state.store.search_runs(&query).await.map_err(|e| match e {
        StoreError::Invalid {
            field: "cursor", ..
        } => MlflowError::invalid("page_token", "not a token this server gave for this search"),
        other => other.into(),
    })?;
    let runs: Vec<Value> = page.runs.iter().map(|r| wire::run(r, &[])).collect();
    let mut out = json!({"runs": runs});
    if let Some(token) = page.next_cursor {
        out["next_page_token"] = json!(token);
    }
    Ok(Json(out))
}

#[derive(Deserialize)]
struct LogParam {
    #[serde(flatten)]
    run: RunRef,
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

/// Params are write-once: the same value again is fine, another one is refused.
pub async fn log_params(state: &AppState, run_id: &str, params: &[KeyValue]) -> MlflowResult<()> {
    for p in params {
        check_param(p)?;
    }
    let pairs: Vec<(String, String)> = params
        .iter()
        .map(|p| (p.key.clone(), p.value.clone()))
        .collect();
    Ok(state.store.log_params(run_id, &pairs).await?)
}

async fn log_parameter(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<LogParam>,
) -> MlflowResult<Json<Value>> {
    let id = body.run.id()?;
    loggable(&state, &caller, id).await?;
    let param = KeyValue {
        key: body.key,
        value: body.value,
    };
    log_params(&state, id, &[param]).await?;
    Ok(Json(json!({})))
}

async fn set_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<LogParam>,
) -> MlflowResult<Json<Value>> {
    let id = body.run.id()?;
    loggable(&state, &caller, id).await?;
    let tag = KeyValue {
        key: body.key,
        value: body.value,
    };
    apply_tags(&state, id, &[tag]).await?;
    Ok(Json(json!({})))
}

async fn delete_tag(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<LogParam>,
) -> MlflowResult<Json<Value>> {
    let id = body.run.id()?;
    loggable(&state, &caller, id).await?;
    if body.key == NOTE_TAG {
        let clear = RunUpdate {
            notes: Some(String::new()),
            ..RunUpdate::default()
        };
        state.store.update_run(id, clear).await?;
        return Ok(Json(json!({})));
    }
    state.store.delete_tag(id, &body.key).await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
struct LogInputs {
    #[serde(flatten)]
    run: RunRef,
    #[serde(default)]
    datasets: Vec<Value>,
}

/// Dataset inputs: every field within its limit (`validate::inputs`), only MLflow's fields
/// kept; the store refuses inputs past a run's count or byte limit.
async fn log_inputs(
    State(state): State<AppState>,
    caller: Caller,
    Fields(body): Fields<LogInputs>,
) -> MlflowResult<Json<Value>> {
    let id = body.run.id()?;
    loggable(&state, &caller, id).await?;
    let inputs = crate::validate::inputs::dataset_inputs(&body.datasets)?;
    state.store.log_inputs(id, &inputs).await?;
    Ok(Json(json!({})))
}
