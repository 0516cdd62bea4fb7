//! `POST/GET /api/v1/runs`, `GET/PATCH /api/v1/runs/{id}`.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use tracing::instrument;
use trainer::wire::RunPatch;

use super::experiments::validate_name;
use super::openapi::RunPatchDoc;
use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::search::SearchParams;
use crate::status::change_status;
use crate::store::{NewRun, Run, RunPage, RunUpdate, DEFAULT_EXPERIMENT};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs", get(search_runs).post(create_run))
        .route("/runs/{id}", get(get_run).patch(patch_run))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// Experiment id or name; a new name creates the experiment. Default: `Default`.
    #[serde(default)]
    pub experiment: Option<String>,
    /// Generated when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Resolved config (a JSON object); flattened into params. Write-once.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Launch the run on this server's GPUs/CPU slots (then `config` may also be YAML text).
    #[serde(default)]
    pub launch: bool,
    /// Launch: a built-in profile instead of `config`.
    #[serde(default)]
    pub profile: Option<String>,
    /// Launch: dotted config keys to override, e.g. `{"training.max_steps": 50}`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub overrides: BTreeMap<String, serde_json::Value>,
    /// Launch: `{gpus: N}` (0 = CPU).
    #[serde(default)]
    pub resources: Option<super::launch::Resources>,
    /// Launch: relaunch a failed run (with `--resume latest`) up to this many times.
    #[serde(default)]
    pub max_restarts: Option<u32>,
    /// Launch: a custom entrypoint (shell line or argv) instead of the trainer.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub command: Option<super::launch::CommandSpec>,
}

impl CreateRun {
    /// A launch-only field on a request that does not launch (a likely mistake, never ignored).
    fn launch_only_field(&self) -> Option<&'static str> {
        [
            ("profile", self.profile.is_some()),
            ("overrides", !self.overrides.is_empty()),
            ("resources", self.resources.is_some()),
            ("max_restarts", self.max_restarts.is_some()),
            ("command", self.command.is_some()),
        ]
        .into_iter()
        .find_map(|(field, set)| set.then_some(field))
    }

    fn into_launch(self) -> super::launch::LaunchRequest {
        super::launch::LaunchRequest {
            experiment: self.experiment,
            name: self.name,
            tags: self.tags,
            config: self.config,
            profile: self.profile,
            overrides: self.overrides,
            resources: self.resources,
            max_restarts: self.max_restarts,
            command: self.command,
        }
    }
}

fn validate_config(config: &Option<serde_json::Value>) -> Result<(), ApiError> {
    match config {
        Some(v) if !v.is_object() => Err(ApiError::unprocessable(
            "config",
            "config must be a JSON object",
        )),
        _ => Ok(()),
    }
}

fn validate_tags(tags: &BTreeMap<String, String>) -> Result<(), ApiError> {
    for key in tags.keys() {
        validate_name("tags", key)?;
    }
    Ok(())
}

/// Creates a run (status `created`) in an experiment named or identified by `experiment`.
#[utoipa::path(post, path = "/api/v1/runs", tag = "runs",
    request_body = CreateRun,
    responses(
        (status = 201, description = "Created", body = Run),
        (status = 422, description = "Invalid field", body = ErrorBody),
    ))]
#[instrument(skip(state, body))]
pub async fn create_run(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateRun>,
) -> Result<(StatusCode, Json<Run>), ApiError> {
    if body.launch {
        return super::launch::create_launched_run(&state, body.into_launch()).await;
    }
    if let Some(field) = body.launch_only_field() {
        return Err(ApiError::bad_request(
            field,
            format!("`{field}` is only used with `launch: true`"),
        ));
    }
    let experiment = body.experiment.as_deref().unwrap_or(DEFAULT_EXPERIMENT);
    validate_name("experiment", experiment)?;
    if let Some(name) = &body.name {
        validate_name("name", name)?;
    }
    validate_config(&body.config)?;
    validate_tags(&body.tags)?;
    let experiment = state.store.resolve_experiment(experiment.trim()).await?;
    let run = state
        .store
        .create_run(NewRun {
            experiment_id: experiment.id,
            name: body.name.map(|n| n.trim().to_string()),
            config: body.config,
            tags: body.tags,
            status: None,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(run)))
}

/// One run with its params, tags and latest value of every metric.
#[utoipa::path(get, path = "/api/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses((status = 200, body = Run), (status = 404, body = ErrorBody)))]
#[instrument(skip(state))]
pub async fn get_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Run>, ApiError> {
    Ok(Json(state.store.get_run(&id).await?))
}

/// Searches runs with filters on status, tags, params and latest metrics; cursor-paginated.
#[utoipa::path(get, path = "/api/v1/runs", tag = "runs",
    params(SearchParams),
    responses((status = 200, body = RunPage), (status = 400, body = ErrorBody)))]
#[instrument(skip(state))]
pub async fn search_runs(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<SearchParams>,
) -> Result<Json<RunPage>, ApiError> {
    let query = params.to_query(&state.store).await?;
    Ok(Json(state.store.search_runs(&query).await?))
}

/// Updates name, tags (merged), notes, the write-once config, and/or the status (with a reason).
#[utoipa::path(patch, path = "/api/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    request_body = RunPatchDoc,
    responses(
        (status = 200, description = "The updated run", body = Run),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Config already set to something else", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
#[instrument(skip(state, patch))]
pub async fn patch_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(patch): ApiJson<RunPatch>,
) -> Result<Json<Run>, ApiError> {
    if let Some(name) = &patch.name {
        validate_name("name", name)?;
    }
    validate_config(&patch.config)?;
    if let Some(tags) = &patch.tags {
        validate_tags(tags)?;
    }
    if patch.reason.is_some() && patch.status.is_none() {
        return Err(ApiError::unprocessable(
            "reason",
            "a reason is only accepted together with a status",
        ));
    }
    let update = RunUpdate {
        name: patch.name.map(|n| n.trim().to_string()),
        tags: patch.tags,
        notes: patch.notes,
        config: patch.config,
    };
    let has_update = update.name.is_some()
        || update.tags.is_some()
        || update.notes.is_some()
        || update.config.is_some();
    let mut run = if has_update {
        state.store.update_run(&id, update).await?
    } else {
        state.store.get_run(&id).await?
    };
    if let Some(status) = patch.status {
        if status != run.status {
            change_status(
                state.store.as_ref(),
                &state.live,
                &id,
                status,
                patch.reason.as_deref(),
                None,
            )
            .await?;
            run = state.store.get_run(&id).await?;
        }
    }
    Ok(Json(run))
}
