//! The JSON REST API v1: one module per resource, each with its `router()` (paths relative to
//! `/api/v1`), merged in `api_router`.

pub mod charts;
pub mod checkpoints;
pub mod events;
pub mod experiments;
pub mod experts;
pub mod health;
pub mod launch;
pub mod logs;
pub mod metrics;
pub mod openapi;
pub mod runs;

use axum::{middleware, Router};

use crate::app::AppState;

/// Every `/api/v1` route (paths here are relative to that prefix), behind the bearer-token check.
/// A new resource adds its module here and one `.merge(...)` line.
pub fn api_router(state: &AppState) -> Router<AppState> {
    Router::new()
        .merge(experiments::router())
        .merge(runs::router())
        .merge(launch::router())
        .merge(checkpoints::router())
        .merge(logs::router())
        .merge(metrics::router())
        .merge(experts::router())
        .merge(events::router())
        .merge(openapi::router())
        .merge(charts::router())
        .fallback(crate::http::not_found)
        .method_not_allowed_fallback(crate::http::method_not_allowed)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::http::auth::require_token,
        ))
}
