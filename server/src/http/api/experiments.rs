//! `POST/GET /api/v1/experiments`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tracing::instrument;

use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::ApiJson;
use crate::store::Experiment;
use crate::validate::Name;

pub fn router() -> Router<AppState> {
    Router::new().route(
        "/experiments",
        get(list_experiments).post(create_experiment),
    )
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateExperiment {
    pub name: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ExperimentList {
    pub experiments: Vec<Experiment>,
}

/// Creates an experiment; names are unique.
#[utoipa::path(post, path = "/api/v1/experiments", tag = "experiments",
    request_body = CreateExperiment,
    responses(
        (status = 201, description = "Created", body = Experiment),
        (status = 409, description = "An experiment with that name exists", body = ErrorBody),
        (status = 422, description = "Invalid name", body = ErrorBody),
    ))]
#[instrument(skip(state, body))]
pub async fn create_experiment(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateExperiment>,
) -> Result<(StatusCode, Json<Experiment>), ApiError> {
    let name = Name::parse("name", &body.name)?;
    let experiment = state.store.create_experiment(name.as_str()).await?;
    Ok((StatusCode::CREATED, Json(experiment)))
}

/// Lists every experiment.
#[utoipa::path(get, path = "/api/v1/experiments", tag = "experiments",
    responses((status = 200, body = ExperimentList)))]
#[instrument(skip(state))]
pub async fn list_experiments(
    State(state): State<AppState>,
) -> Result<Json<ExperimentList>, ApiError> {
    let experiments = state.store.list_experiments().await?;
    Ok(Json(ExperimentList { experiments }))
}
