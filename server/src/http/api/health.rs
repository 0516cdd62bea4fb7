//! `GET /healthz`: the process is up and the store answers.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::app::AppState;
use crate::http::error::ApiError;
use crate::store::StoreError;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok` when the response is 200 (an unhealthy store answers 503).
    pub status: &'static str,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    pub version: &'static str,
    /// Whether the runs this server launches are confined (Landlock); false when its kernel
    /// has no Landlock or its operator started it with `--unconfined-runs`.
    pub runs_confined: bool,
}

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz))
}

/// Seconds a health checker is asked to wait before asking again while the store is unhealthy.
const RETRY_AFTER_S: u32 = 10;

#[utoipa::path(get, path = "/healthz", tag = "health",
    responses(
        (status = 200, body = Health),
        (status = 503, description = "The store cannot read, or cannot write since its last \
            write failed (e.g. a full disk)", body = crate::http::error::ErrorBody),
    ))]
pub async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    // A cheap read, plus a small write after a failed one (see `Store::health`).
    if let Err(e) = state.store.health().await {
        tracing::warn!(error = %format!("{e:#}"), "health check failed");
        let why = match e {
            StoreError::StorageFull(_) => "the database is out of disk space",
            _ => "the database does not answer",
        };
        return Err(ApiError::Unavailable {
            message: format!("unhealthy: {why}"),
            retry_after: RETRY_AFTER_S,
        });
    }
    Ok(Json(Health {
        status: "ok",
        backend: state.store.backend(),
        version: env!("CARGO_PKG_VERSION"),
        runs_confined: state.launcher.confinement().is_on(),
    }))
}
