//! `POST/GET /api/v1/runs`, `GET/PATCH /api/v1/runs/{id}`.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use tracing::instrument;
use trainer::wire::RunPatch;

use super::openapi::RunPatchDoc;
use crate::access::audit::Actor;
use crate::access::Principal;
use crate::actions::{CommandSpec, LaunchRequest, Resources};
use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{ApiJson, ApiQuery};
use crate::search::SearchParams;
use crate::store::{ExitInfo, LatestMetric, Run, RunStatus, DEFAULT_EXPERIMENT};
use crate::validate::limits::{preview, LIST_NOTES_LEN};
use crate::validate::{tracked_config, Invalid, Name, RunEdit, Tags};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs", get(search_runs).post(create_run))
        .route(
            "/runs/{id}",
            get(get_run).patch(patch_run).delete(delete_run),
        )
        .route("/runs/{id}/heartbeat", axum::routing::post(heartbeat))
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
    pub resources: Option<Resources>,
    /// Launch: relaunch a failed run (with `--resume latest`) up to this many times.
    #[serde(default)]
    pub max_restarts: Option<u32>,
    /// Launch: a custom entrypoint (shell line or argv) instead of the trainer.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub command: Option<CommandSpec>,
    /// Launch: the absolute directory that relative paths in the config (`data.dataset`,
    /// `data.tokenizer`, `data.cache_dir`, `training.init_from`) resolve against, normally the
    /// submitter's current directory (`trainyard submit` sends it). Without it they resolve
    /// against the server's working directory. The run's stored config holds the absolute paths.
    #[serde(default)]
    pub working_dir: Option<String>,
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
            ("working_dir", self.working_dir.is_some()),
        ]
        .into_iter()
        .find_map(|(field, set)| set.then_some(field))
    }

    fn into_launch(self) -> LaunchRequest {
        LaunchRequest {
            experiment: self.experiment,
            name: self.name,
            tags: self.tags,
            config: self.config,
            profile: self.profile,
            overrides: self.overrides,
            resources: self.resources,
            max_restarts: self.max_restarts,
            command: self.command,
            working_dir: self.working_dir,
            env: BTreeMap::new(),
        }
    }
}

/// Latest metrics a runs list item carries at most: a run may log any number of keys, and a
/// page of items stays small whatever its runs hold.
pub const LIST_METRICS: usize = 100;

/// A run as the runs list shows it: everything but the config (its flattened `params` are
/// here), at most the first 1,024 bytes of the notes and at most 100 latest metrics (the ones
/// the search sorts or filters by, then the most recently logged). `GET /api/v1/runs/{id}` has
/// them all.
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
    /// At most 100 metric keys' latest points: those the search's `sort` and `q` name, then
    /// the most recently logged.
    pub latest_metrics: BTreeMap<String, LatestMetric>,
    /// How many metric keys the run has (more than `latest_metrics` holds when truncated).
    pub latest_metrics_total: usize,
    /// True when `latest_metrics` holds only some of the run's keys.
    pub latest_metrics_truncated: bool,
    /// The user who created the run.
    pub created_by: Option<String>,
}

/// At most [`LIST_METRICS`] of `all`: the keys `wanted` first, then the most recently logged
/// (latest time, then highest step, then key order).
pub fn list_metrics(
    all: BTreeMap<String, LatestMetric>,
    wanted: &[String],
) -> BTreeMap<String, LatestMetric> {
    if all.len() <= LIST_METRICS {
        return all;
    }
    use std::cmp::Reverse;
    let wanted: std::collections::HashSet<&String> = wanted.iter().collect();
    let mut ranked: Vec<(bool, String, LatestMetric)> = all
        .into_iter()
        .map(|(k, m)| (!wanted.contains(&k), k, m))
        .collect();
    ranked.sort_by(|(la, ka, a), (lb, kb, b)| {
        (la, Reverse(a.time), Reverse(a.step), ka).cmp(&(lb, Reverse(b.time), Reverse(b.step), kb))
    });
    ranked.truncate(LIST_METRICS);
    ranked.into_iter().map(|(_, k, m)| (k, m)).collect()
}

/// The metric keys among `keys` a search may name: the one `sort=metrics.K` sorts by, and
/// those whose name appears in the filter `q` (however it quotes them).
fn named_metrics<'a>(params: &SearchParams, keys: impl Iterator<Item = &'a String>) -> Vec<String> {
    let sort = params.value("sort");
    let sorted = sort
        .trim_start_matches(['-', '+'])
        .strip_prefix("metrics.")
        .unwrap_or("");
    let q = params.value("q");
    keys.filter(|k| k.as_str() == sorted || (!q.is_empty() && q.contains(k.as_str())))
        .cloned()
        .collect()
}

impl RunSummary {
    /// The list item of `run`, keeping the metrics `wanted` when it has too many to list.
    pub fn of(mut run: Run, wanted: &[String]) -> Self {
        let all = std::mem::take(&mut run.latest_metrics);
        let latest_metrics_total = all.len();
        let latest_metrics = list_metrics(all, wanted);
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
            latest_metrics_truncated: latest_metrics.len() < latest_metrics_total,
            latest_metrics_total,
            latest_metrics,
            created_by: run.created_by,
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
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 403, description = "A `command` launch on a server that does not allow them",
            body = ErrorBody),
        (status = 404, description = "No experiment with that id", body = ErrorBody),
        (status = 422, description = "A refused value, named in `field`: invalid or over its \
            size limit, a launch-only field without `launch`, a launch config the trainer \
            would refuse, a dataset, tokenizer or checkpoint path that does not exist, more GPUs \
            than the server has", body = ErrorBody),
    ))]
#[instrument(skip(state, actor, body))]
pub async fn create_run(
    State(state): State<AppState>,
    actor: Actor,
    ApiJson(body): ApiJson<CreateRun>,
) -> Result<(StatusCode, Json<Run>), ApiError> {
    let principal = &actor.principal;
    if body.launch {
        let run = crate::actions::launch_run(&state, &actor, body.into_launch()).await?;
        return Ok((StatusCode::CREATED, Json(run)));
    }
    if let Some(field) = body.launch_only_field() {
        return Err(
            Invalid::new(field, format!("`{field}` is only used with `launch: true`")).into(),
        );
    }
    let experiment = Name::parse(
        "experiment",
        body.experiment.as_deref().unwrap_or(DEFAULT_EXPERIMENT),
    )?;
    crate::access::may_add_runs(&state, principal, Some(experiment.as_str())).await?;
    let name = body.name.map(|n| Name::parse("name", &n)).transpose()?;
    let config = tracked_config(body.config)?;
    let tags = Tags::parse(body.tags)?;
    let experiment_id =
        crate::access::experiment_for_new_run(&state, principal, Some(experiment.as_str())).await?;
    let tracked = crate::actions::TrackedRun {
        experiment_id,
        name: name.map(Name::into_string),
        config,
        tags: tags.into_inner(),
        ..Default::default()
    };
    let run = crate::actions::create_run(&state, &actor, tracked).await?;
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
    Extension(principal): Extension<Principal>,
    ApiQuery(params): ApiQuery<SearchParams>,
) -> Result<Json<RunList>, ApiError> {
    let query = crate::search::visible_query(&state, &principal, &params).await?;
    let page = state
        .store
        .search_runs(&query)
        .await
        .map_err(crate::search::SearchOrStoreError::from)?;
    let runs = page
        .runs
        .into_iter()
        .map(|run| {
            let wanted = match run.latest_metrics.len() > LIST_METRICS {
                true => named_metrics(&params, run.latest_metrics.keys()),
                false => Vec::new(),
            };
            RunSummary::of(run, &wanted)
        })
        .collect();
    Ok(Json(RunList {
        runs,
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
    let edit = RunEdit::parse(patch)?;
    if edit.status.is_some() {
        // A client reporting its run's new status is alive (whoever else edits tags or
        // notes is not a sign of the run's life).
        state.liveness.record(&id);
    }
    Ok(Json(crate::actions::edit_run(&state, &id, edit).await?))
}

/// Deletes a run that is not queued or running, with its metrics, and for a launched run its
/// directory (MANAGE on its experiment).
#[utoipa::path(delete, path = "/api/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 409, description = "The run is queued or running: stop it first", body = ErrorBody),
    ))]
#[instrument(skip(state, actor))]
pub async fn delete_run(
    State(state): State<AppState>,
    actor: Actor,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::actions::delete_run(&state, &actor, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A reporting client's sign of life. A running run this server did not launch that sends no
/// heartbeat, metric or status for `--lost-after-secs` (default 300) is marked `lost`; a
/// heartbeat from a `lost` run makes it `running` again. The trainer sends one every 30 s.
#[utoipa::path(post, path = "/api/v1/runs/{id}/heartbeat", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 204, description = "Noted"),
        (status = 404, body = ErrorBody),
    ))]
#[instrument(skip(state))]
pub async fn heartbeat(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.store.get_run(&id).await?;
    crate::liveness::seen(&state, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
