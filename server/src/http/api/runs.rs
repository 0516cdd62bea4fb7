//! `POST/GET /api/v1/runs`, `GET/PATCH /api/v1/runs/{id}`.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tracing::instrument;
use trainer::wire::RunPatch;

use super::limits::{
    check_len, preview, validate_config, validate_name, validate_tags, LIST_NOTES_LEN,
    MAX_NOTES_LEN, MAX_REASON_LEN, MAX_TAGS,
};
use super::openapi::RunPatchDoc;
use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::search::SearchParams;
use crate::status::{change_status, illegal_transition, transition_allowed, Actor};
use crate::store::{ExitInfo, LatestMetric, NewRun, Run, RunStatus, RunUpdate, DEFAULT_EXPERIMENT};

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

/// A run as the runs list shows it: everything but the config (its flattened `params` are
/// here) and at most the first 1,024 bytes of the notes. `GET /api/v1/runs/{id}` has both whole.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunSummary {
    pub id: String,
    pub name: String,
    pub experiment_id: String,
    #[schema(value_type = String)]
    pub status: RunStatus,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub params: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    /// The start of the notes.
    pub notes: String,
    /// True when `notes` is only the start of the run's notes.
    pub notes_truncated: bool,
    pub exit: Option<ExitInfo>,
    pub latest_metrics: BTreeMap<String, LatestMetric>,
}

impl From<Run> for RunSummary {
    fn from(run: Run) -> Self {
        let notes_truncated = run.notes.len() > LIST_NOTES_LEN;
        let notes = if notes_truncated {
            preview(&run.notes, LIST_NOTES_LEN).to_string()
        } else {
            run.notes
        };
        RunSummary {
            id: run.id,
            name: run.name,
            experiment_id: run.experiment_id,
            status: run.status,
            created_at: run.created_at,
            started_at: run.started_at,
            ended_at: run.ended_at,
            params: run.params,
            tags: run.tags,
            notes,
            notes_truncated,
            exit: run.exit,
            latest_metrics: run.latest_metrics,
        }
    }
}

/// One page of `GET /api/v1/runs`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunList {
    pub runs: Vec<RunSummary>,
    /// Pass back as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Creates a run (status `created`) in an experiment named or identified by `experiment`.
#[utoipa::path(post, path = "/api/v1/runs", tag = "runs",
    request_body = CreateRun,
    responses(
        (status = 201, description = "Created (a launch whose run directory cannot be prepared \
            is created `failed`, with the reason)", body = Run),
        (status = 400, description = "Malformed request, a launch-only field without \
            `launch`, or a launch config that is invalid or over its limits", body = ErrorBody),
        (status = 403, description = "A `command` launch on a server that does not allow them",
            body = ErrorBody),
        (status = 404, description = "No experiment with that id", body = ErrorBody),
        (status = 422, description = "Invalid field or a field over its size limit",
            body = ErrorBody),
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
    responses(
        (status = 200, body = RunList),
        (status = 400, body = ErrorBody),
        (status = 404, description = "No experiment with that id or name", body = ErrorBody),
    ))]
#[instrument(skip(state))]
pub async fn search_runs(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<SearchParams>,
) -> Result<Json<RunList>, ApiError> {
    let query = params.to_query(&state.store).await?;
    let page = state.store.search_runs(&query).await?;
    Ok(Json(RunList {
        runs: page.runs.into_iter().map(RunSummary::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// Updates name, tags (merged), notes, the write-once config, and/or the status (with a reason).
#[utoipa::path(patch, path = "/api/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    request_body = RunPatchDoc,
    responses(
        (status = 200, description = "The updated run", body = Run),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Config already set to something else, or a status \
            change the run lifecycle does not allow (the message names both statuses)",
            body = ErrorBody),
        (status = 422, description = "Invalid field or a field over its size limit",
            body = ErrorBody),
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
    if let Some(notes) = &patch.notes {
        check_len("notes", notes, MAX_NOTES_LEN)?;
    }
    if let Some(reason) = &patch.reason {
        check_len("reason", reason, MAX_REASON_LEN)?;
    }
    if patch.reason.is_some() && patch.status.is_none() {
        return Err(ApiError::unprocessable(
            "reason",
            "a reason is only accepted together with a status",
        ));
    }
    let current = state.store.get_run(&id).await?;
    // Refuse an illegal status change before anything else is written, so a refused request
    // changes nothing (`change_status` checks again under the run's lock).
    if let Some(status) = patch.status {
        if status != current.status && !transition_allowed(current.status, status, Actor::Client) {
            return Err(illegal_transition(current.status, status).into());
        }
    }
    if let Some(tags) = &patch.tags {
        // Tags merge into the run's: bound the result, not only this request.
        let merged = current
            .tags
            .keys()
            .chain(tags.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        if merged > MAX_TAGS {
            return Err(ApiError::unprocessable(
                "tags",
                format!("the run would have {merged} tags; at most {MAX_TAGS} are allowed"),
            ));
        }
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
        current
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
                Actor::Client,
            )
            .await?;
            run = state.store.get_run(&id).await?;
        }
    }
    Ok(Json(run))
}
