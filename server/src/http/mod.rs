//! The REST API v1: one module per resource, each with its `router()`, merged in `api_router`.

pub mod auth;
pub mod checkpoints;
pub mod compare_page;
pub mod error;
pub mod events;
pub mod experiments;
pub mod experts;
pub mod extract;
pub mod health;
pub mod launch;
pub mod launch_page;
pub mod logs;
pub mod metrics;
pub mod openapi;
pub mod pages;
pub mod run_page;
pub mod runs;
pub mod runs_page;
pub mod views;

use axum::http::{Method, Uri};
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
        .merge(experts::router())
        .merge(events::router())
        .merge(openapi::router())
        .merge(crate::charts::router(state.store.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
}

/// JSON 404 for any path no router knows.
pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

/// JSON 405 for a known path with a method it does not serve.
pub async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::MethodNotAllowed(method.to_string())
}

/// A handler panicked: answer a JSON 500 (the panic itself is logged, never sent).
pub fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    axum::response::IntoResponse::into_response(ApiError::Internal(anyhow::anyhow!(
        "handler panicked: {detail}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[tokio::test]
    async fn a_panic_becomes_a_json_500_that_does_not_show_the_panic() {
        let response = panic_response(Box::new("secret detail"));
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("\"code\":\"internal\""), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}
