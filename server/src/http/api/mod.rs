//! The JSON REST API v1: one module per resource, each with its `router()` (paths relative to
//! `/api/v1`), merged in `api_router`.

pub mod account;
pub mod admin;
pub mod charts;
pub mod checkpoints;
pub mod events;
pub mod experiments;
pub mod experts;
pub mod export;
pub mod health;
pub mod launch;
pub mod logs;
pub mod metrics;
pub mod model_files;
pub mod models;
pub mod openapi;
pub mod runs;
pub mod sweeps;

use axum::Router;

use crate::app::AppState;

/// Every `/api/v1` route (paths here are relative to that prefix). A new resource adds its
/// module here, one `.merge(...)` line and its rows in `access::policy` (the access check,
/// applied in `app::app`, refuses a route without one).
pub fn api_router() -> Router<AppState> {
    Router::new()
        .merge(account::router())
        .merge(admin::router())
        .merge(experiments::router())
        .merge(runs::router())
        .merge(launch::router())
        .merge(checkpoints::router())
        .merge(export::router())
        .merge(logs::router())
        .merge(metrics::router())
        .merge(experts::router())
        .merge(events::router())
        .merge(openapi::router())
        .merge(charts::router())
        .merge(sweeps::router())
        .merge(models::router())
        .merge(model_files::router())
        .fallback(crate::http::not_found)
        .method_not_allowed_fallback(crate::http::method_not_allowed)
}
