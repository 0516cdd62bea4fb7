//! The REST API v1: one module per resource, each with its `router()`, merged in `api_router`.

pub mod auth;
pub mod checkpoints;
pub mod compare_page;
pub mod error;
pub mod events;
pub mod experiments;
pub mod extract;
pub mod health;
pub mod launch;
pub mod launch_page;
pub mod logs;
pub mod metrics;
pub mod openapi;
pub mod pages;
pub mod runs;
pub mod views;

use axum::http::Uri;
use axum::{middleware, Router};

use crate::app::AppState;
pub use error::ApiError;

/// Every `/api/v1` route (paths here are relative to that prefix), behind the bearer-token check.
/// A new resource adds its module here and one `.merge(...)` line.
pub fn api_router(state: &AppState) -> Router<AppState> {
    Router::new()
        .merge(experiments::router())
        .merge(runs::router())
        .merge(launch::router())
        .merge(logs::router())
        .merge(metrics::router())
        .merge(events::router())
        .merge(openapi::router())
        .merge(crate::charts::router(state.store.clone()))
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
}

/// JSON 404 for any path no router knows.
pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}
