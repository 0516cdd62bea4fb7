//! A launched run's checkpoints: list, download one as a tar archive, resume the run from one,
//! sample text from one.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tracing::instrument;

use crate::actions::Resources;
use crate::app::AppState;
use crate::checkpoints::{self, archive, Checkpoint, ResumePoint};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiJson;
use crate::store::Run;
use crate::validate::Invalid;

pub use crate::actions::sample::{
    sample_text, SampleRequest, SampleResponse, MAX_PROMPT_LEN, MAX_SAMPLE_TOKENS,
};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs/{id}/checkpoints", get(list_checkpoints))
        .route("/runs/{id}/checkpoints/{name}/archive", get(download))
        .route("/runs/{id}/checkpoints/{name}/sample", post(sample))
        .route("/runs/{id}/resume", post(resume))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CheckpointList {
    pub checkpoints: Vec<Checkpoint>,
}

/// The run's directory, once the run is known to exist (ids are validated hex by then).
async fn run_dir(state: &AppState, id: &str) -> Result<std::path::PathBuf, ApiError> {
    state.store.get_run(id).await?;
    Ok(state.launcher.run_dir(id))
}

/// The run's checkpoints by step, each with its step, time, size, validation loss and whether
/// it is the best. Empty for a run that has written none (or was not launched here).
#[utoipa::path(get, path = "/api/v1/runs/{id}/checkpoints", tag = "checkpoints",
    params(("id" = String, Path, description = "Run id")),
    responses((status = 200, body = CheckpointList), (status = 404, body = ErrorBody)))]
#[instrument(skip(state))]
pub async fn list_checkpoints(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<CheckpointList>, ApiError> {
    let dir = run_dir(&state, &id).await?;
    let checkpoints = tokio::task::spawn_blocking(move || checkpoints::list(&dir))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    Ok(Json(CheckpointList { checkpoints }))
}

/// The checkpoint `name` (as listed) as an uncompressed tar archive holding one folder.
#[utoipa::path(get, path = "/api/v1/runs/{id}/checkpoints/{name}/archive", tag = "checkpoints",
    params(("id" = String, Path, description = "Run id"),
           ("name" = String, Path, description = "Checkpoint name, e.g. `step-000300` or `best`")),
    responses(
        (status = 200, description = "A tar archive", content_type = "application/x-tar"),
        (status = 404, body = ErrorBody),
    ))]
#[instrument(skip(state))]
pub async fn download(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let dir = run_dir(&state, &id).await?;
    let wanted = name.clone();
    let found = tokio::task::spawn_blocking(move || {
        let (_, path) = checkpoints::find(&dir, &wanted)?;
        archive::files(&path).ok()
    })
    .await
    .map_err(|e| ApiError::Internal(e.into()))?;
    let Some(files) = found else {
        return Err(ApiError::NotFound(format!(
            "checkpoint `{name}` of run `{id}` not found"
        )));
    };
    let len = archive::archive_len(&files);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let root = name.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = archive::write(&root, &files, &tx) {
            // The client sees a short body; the length header tells it the download broke.
            tracing::warn!(error = %e, "checkpoint download ended early");
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let disposition = format!("attachment; filename=\"{id}-{name}.tar\"");
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-tar".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}

/// `POST /runs/{id}/resume`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// `latest` (default), `best`, or a checkpoint's step number.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub from: Option<serde_json::Value>,
    /// GPUs for the resumed attempt (default: as the run had).
    #[serde(default)]
    pub resources: Option<Resources>,
}

impl ResumeRequest {
    pub fn point(&self) -> Result<ResumePoint, Invalid> {
        match &self.from {
            None => Ok(ResumePoint::Latest),
            Some(serde_json::Value::String(text)) => ResumePoint::parse("from", text),
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().map(ResumePoint::Step).ok_or_else(|| {
                    Invalid::new(
                        "from",
                        "from must be `latest`, `best` or a step number (>= 0)",
                    )
                })
            }
            Some(_) => Err(Invalid::new(
                "from",
                "from must be `latest`, `best` or a step number",
            )),
        }
    }
}

/// Continues an ended run that this server launched, from one of its checkpoints, as a new
/// attempt of the same run: it is queued again, its metrics go on in the same series (a step
/// stored before keeps its first value), and the attempt is recorded in its events.
/// Relaunching (`POST /runs` with the run's config) is different: a new run from step 0.
#[utoipa::path(post, path = "/api/v1/runs/{id}/resume", tag = "launcher",
    params(("id" = String, Path, description = "Run id")),
    request_body = ResumeRequest,
    responses(
        (status = 202, description = "Queued to resume", body = Run),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not launched here, a custom command, or not ended",
            body = ErrorBody),
        (status = 422, description = "No such checkpoint (the message lists the steps there \
            are), or more GPUs than the server has", body = ErrorBody),
    ))]
#[instrument(skip(state, actor, body))]
pub async fn resume(
    State(state): State<AppState>,
    actor: crate::access::audit::Actor,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ResumeRequest>,
) -> Result<(StatusCode, Json<Run>), ApiError> {
    let point = body.point()?;
    if let Some(r) = &body.resources {
        // A resumed run stays where it ran: its executor and Slurm options are its own.
        if r.executor.is_some() || r.slurm.is_some() {
            return Err(Invalid::new(
                "resources",
                "a resumed run keeps its executor and Slurm options; only resources.gpus can change",
            )
            .into());
        }
    }
    let gpus = body.resources.map(|r| r.gpus);
    let run = crate::actions::resume_run(&state, &actor, &id, point, gpus).await?;
    Ok((StatusCode::ACCEPTED, Json(run)))
}

/// `POST /runs/{id}/checkpoints/{name}/sample`.
/// Continues a prompt with the model of one checkpoint (on the server's CPU, one request at a
/// time).
#[utoipa::path(post, path = "/api/v1/runs/{id}/checkpoints/{name}/sample", tag = "checkpoints",
    params(("id" = String, Path, description = "Run id"),
           ("name" = String, Path, description = "Checkpoint name, e.g. `step-000300` or `best`")),
    request_body = SampleRequest,
    responses(
        (status = 200, body = SampleResponse),
        (status = 404, body = ErrorBody),
        (status = 422, description = "A sampling parameter out of range", body = ErrorBody),
    ))]
#[instrument(skip(state, request))]
pub async fn sample(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
    ApiJson(request): ApiJson<SampleRequest>,
) -> Result<Json<SampleResponse>, ApiError> {
    Ok(Json(sample_text(&state, &id, &name, &request).await?))
}
