//! `POST /api/v1/runs/{id}/stop`. (Launching is the `launch: true` form of `POST /api/v1/runs`;
//! both call `crate::actions`.)

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Serialize;
use tracing::instrument;

use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::launcher::StopOutcome;

pub fn router() -> Router<AppState> {
    Router::new().route("/runs/{id}/stop", post(stop_run))
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
