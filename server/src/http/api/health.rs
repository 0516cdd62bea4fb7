//! `GET /healthz`: the process is up and the store answers.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::app::AppState;
use crate::http::error::ApiError;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok` when the response is 200.
    pub status: &'static str,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    pub version: &'static str,
}

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz))
}

#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, body = Health), (status = 500, body = crate::http::error::ErrorBody)))]
pub async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    // A cheap read proves the database connection works.
    state.store.list_experiments().await?;
    Ok(Json(Health {
        status: "ok",
        backend: state.store.backend(),
        version: env!("CARGO_PKG_VERSION"),
    }))
}
