//! The HTTP surface, in two rooms: `api/` (the JSON REST API v1, one module per resource) and
//! `pages/` (the server-rendered dashboard). What both share lives here: the one error type, the
//! JSON/query extractors and the access check, the request guards (host, cross-site, NUL) and
//! the accept loop with its connection limits.

pub mod access;
pub mod api;
pub mod error;
pub mod extract;
pub mod guard;
pub mod mlflow;
pub mod pages;
pub mod palette;
pub mod principal;
pub mod serve;

use axum::http::{Method, Uri};

pub use api::api_router;
pub use error::ApiError;

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
