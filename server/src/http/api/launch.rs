//! `POST /api/v1/runs/{id}/stop`, and `POST /api/v1/runs/{id}/end` for a run this server did not
//! launch. (Launching is the `launch: true` form of `POST /api/v1/runs`;
//! both call `crate::actions`.)

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tracing::instrument;

use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::launcher::StopOutcome;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/runs/{id}/stop", post(stop_run))
        .route("/runs/{id}/end", post(mark_ended))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StopResponse {
    pub id: String,
    /// `stopped` (it was queued) or `stopping` (SIGTERM sent; SIGKILL after the grace period).
    #[schema(value_type = String)]
    pub status: StopOutcome,
}

/// Stops a launched run: a queued one leaves the queue, a running one gets SIGTERM (it
/// checkpoints and exits) and SIGKILL after the grace period.
#[utoipa::path(post, path = "/api/v1/runs/{id}/stop", tag = "launcher",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 202, body = StopResponse),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not queued or running", body = ErrorBody),
    ))]
#[instrument(skip(state, actor))]
pub async fn stop_run(
    State(state): State<AppState>,
    actor: crate::access::audit::Actor,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<StopResponse>), ApiError> {
    let status = crate::actions::stop_run(&state, &actor, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(StopResponse { id, status })))
}

/// How a run this server did not launch ended, as a person marks it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndRequest {
    /// `stopped` or `failed`.
    #[schema(value_type = String, example = "stopped")]
    pub status: crate::store::RunStatus,
    /// Why, recorded in the run's history (required).
    pub reason: String,
}

/// Marks a run this server did not launch (created over the API, by an MLflow client, by
/// `trainyard train --server`) as `stopped` or `failed` with a reason, for a run whose client
/// is gone; once ended it can be deleted. A run launched here is stopped with `/stop`.
#[utoipa::path(post, path = "/api/v1/runs/{id}/end", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    request_body = EndRequest,
    responses(
        (status = 200, description = "The run as stored", body = crate::store::Run),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The run was launched by this server (stop it) or has \
            already ended", body = ErrorBody),
        (status = 422, description = "A status other than stopped or failed, or no reason",
            body = ErrorBody),
    ))]
#[instrument(skip(state, actor, body))]
pub async fn mark_ended(
    State(state): State<AppState>,
    actor: crate::access::audit::Actor,
    Path(id): Path<String>,
    crate::http::extract::ApiJson(body): crate::http::extract::ApiJson<EndRequest>,
) -> Result<Json<crate::store::Run>, ApiError> {
    let run = crate::actions::mark_ended(&state, &actor, &id, body.status, &body.reason).await?;
    Ok(Json(run))
}
