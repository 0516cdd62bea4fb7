//! The MLflow tracking protocol (REST API 2.0), so the official `mlflow` client logs here
//! unchanged: point `MLFLOW_TRACKING_URI` at this server. An MLflow run is a Trainyard run (the
//! same tables), so it streams live to the dashboard and a launched run reads back through
//! `MlflowClient`.
//!
//! Routes live under `/api/2.0/mlflow/` and, for MLflow's own browser UI, the same under
//! `/ajax-api/2.0/mlflow/`; artifacts under `/api/2.0/mlflow-artifacts/artifacts/`. The
//! protocol's types and its mapping onto ours are in `wire.rs`, its errors here, the filter
//! grammar in `filter.rs`. Each route's access rule is a row in `access::policy`: most name
//! their run or experiment in the body, so the handler completes the check ([`Caller`]).

mod artifacts;
mod experiments;
mod filter;
mod metrics;
mod registry;
mod runs;
mod wire;

pub use artifacts::{artifact_root, list_files, relative_path, serve_file};

use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::de::DeserializeOwned;

use crate::access::{self, policy, Principal, Rule};
use crate::app::AppState;
use crate::http::error::ApiError;
use crate::store::StoreError;

/// Both prefixes the MLflow client and UI use.
const PREFIXES: [&str; 2] = ["/api/2.0", "/ajax-api/2.0"];

/// Every MLflow route, under both prefixes.
pub fn router() -> Router<AppState> {
    let mut router = Router::new();
    for prefix in PREFIXES {
        router = router
            .nest(
                &format!("{prefix}/mlflow"),
                Router::new()
                    .merge(experiments::router())
                    .merge(runs::router())
                    .merge(metrics::router())
                    .merge(registry::router())
                    .merge(artifacts::list_router())
                    .fallback(endpoint_not_found),
            )
            .nest(
                &format!("{prefix}/mlflow-artifacts"),
                artifacts::proxy_router().fallback(endpoint_not_found),
            );
    }
    // The 3.x client asks this before downloads; this server offers no multipart transfers.
    router.route(
        "/api/3.0/mlflow/server-info",
        axum::routing::get(server_info),
    )
}

async fn server_info() -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "store_type": "SqlStore",
        "multipart_uploads_enabled": false,
        "multipart_downloads_enabled": false,
    }))
}

/// Whether a route pattern belongs to this protocol (its refusals then take its error shape).
pub fn is_mlflow_route(pattern: &str) -> bool {
    PREFIXES
        .iter()
        .any(|p| pattern.starts_with(&format!("{p}/mlflow")))
}

async fn endpoint_not_found(uri: axum::http::Uri) -> MlflowError {
    MlflowError::new(
        StatusCode::NOT_FOUND,
        "ENDPOINT_NOT_FOUND",
        format!("this server has no MLflow endpoint {}", uri.path()),
    )
}

/// An error as the MLflow client reads it: `{"error_code": ..., "message": ...}` with the HTTP
/// status MLflow gives that code. The client retries 408, 429 and 5xx answers for about four
/// minutes and then drops the message, so a client's mistake is never one of those (not even
/// an illegal status change, which MLflow itself answers with a 500 `INVALID_STATE`).
#[derive(Debug)]
pub struct MlflowError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Headers of the native error worth keeping (`Retry-After`, `WWW-Authenticate`).
    native: Option<Box<Response>>,
}

impl MlflowError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        MlflowError {
            status,
            code,
            message: message.into(),
            native: None,
        }
    }

    /// `INVALID_PARAMETER_VALUE` (400) naming the field.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Self {
        MlflowError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER_VALUE",
            format!("{field}: {message}"),
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        MlflowError::new(StatusCode::NOT_FOUND, "RESOURCE_DOES_NOT_EXIST", message)
    }
}

impl IntoResponse for MlflowError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error_code": self.code, "message": self.message});
        let mut response = (self.status, Json(body)).into_response();
        if let Some(native) = self.native {
            for name in [
                axum::http::header::RETRY_AFTER,
                axum::http::header::WWW_AUTHENTICATE,
            ] {
                if let Some(v) = native.headers().get(&name) {
                    response.headers_mut().insert(name, v.clone());
                }
            }
        }
        response
    }
}

impl From<ApiError> for MlflowError {
    fn from(e: ApiError) -> Self {
        let message = match e.field() {
            Some(field) if !e.to_string().starts_with(&field) => format!("{field}: {e}"),
            _ => e.to_string(),
        };
        let (status, code) = match &e {
            ApiError::BadRequest { .. }
            | ApiError::InvalidFilter { .. }
            | ApiError::Unprocessable { .. }
            | ApiError::UnsupportedMediaType(_) => {
                (StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE")
            }
            ApiError::Conflict { field, .. } => match field.as_deref() {
                Some("name") => (StatusCode::BAD_REQUEST, "RESOURCE_ALREADY_EXISTS"),
                _ => (StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE"),
            },
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "RESOURCE_DOES_NOT_EXIST"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "BAD_REQUEST"),
            ApiError::PayloadTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "INVALID_PARAMETER_VALUE")
            }
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
            ApiError::Forbidden { .. } | ApiError::CrossSite(_) | ApiError::HostNotAllowed(_) => {
                (StatusCode::FORBIDDEN, "PERMISSION_DENIED")
            }
            ApiError::TooManyRequests { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "REQUEST_LIMIT_EXCEEDED")
            }
            ApiError::InsufficientStorage(_) => {
                (StatusCode::INSUFFICIENT_STORAGE, "RESOURCE_EXHAUSTED")
            }
            ApiError::Unavailable { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "TEMPORARILY_UNAVAILABLE")
            }
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "BAD_REQUEST"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR"),
        };
        // The native response logs internal errors and carries the retry headers.
        let native = e.into_response();
        MlflowError {
            status,
            code,
            message,
            native: Some(Box::new(native)),
        }
    }
}

impl From<StoreError> for MlflowError {
    fn from(e: StoreError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<crate::error::Error> for MlflowError {
    fn from(d: crate::error::Error) -> Self {
        ApiError::from(d).into()
    }
}

impl From<crate::validate::Invalid> for MlflowError {
    fn from(e: crate::validate::Invalid) -> Self {
        MlflowError::invalid(&e.field, e.message)
    }
}

pub type MlflowResult<T> = Result<T, MlflowError>;

/// The caller, with the rule of its route, for the handler's half of the access check.
pub struct Caller {
    pub principal: Principal,
    rule: Rule,
    write: bool,
}

impl Caller {
    /// The route's rule applied to the run or experiment the request names.
    pub async fn may(&self, state: &AppState, id: &str) -> MlflowResult<()> {
        Ok(access::require_named(state, &self.principal, self.rule, self.write, id).await?)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = MlflowError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let internal = |what: &str| {
            MlflowError::from(ApiError::Internal(anyhow::anyhow!(
                "an MLflow handler ran without {what}"
            )))
        };
        let principal = parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| internal("the access check"))?;
        let pattern = parts
            .extensions
            .get::<MatchedPath>()
            .ok_or_else(|| internal("a matched route"))?;
        let rule = policy::rule(&parts.method, pattern.as_str())
            .ok_or_else(|| internal("an access rule"))?;
        let write = policy::changes(&parts.method, pattern.as_str());
        Ok(Caller {
            principal,
            rule,
            write,
        })
    }
}

/// A request's fields: the JSON body of a POST, the query string of a GET (the protocol
/// allows both for searches). A malformed one is `INVALID_PARAMETER_VALUE` naming the field.
pub struct Fields<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Fields<T> {
    type Rejection = MlflowError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if req.method() == Method::GET {
            let query = req.uri().query().unwrap_or("");
            return wire::from_query(query).map(Fields);
        }
        let method = req.method().clone();
        let query = req.uri().query().unwrap_or("").to_owned();
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| MlflowError::from(ApiError::from(e)))?;
        let blank = bytes.iter().all(u8::is_ascii_whitespace);
        // MLflow's own UI sends its DELETEs' fields in the query string.
        if blank && method == Method::DELETE && !query.is_empty() {
            return wire::from_query(&query).map(Fields);
        }
        let text: &[u8] = if blank { b"{}" } else { &bytes };
        // No stored text may hold a NUL: refused here for every field, naming it.
        if let Some(refused) = crate::http::extract::nul_in_json(text) {
            return Err(refused.into());
        }
        serde_json::from_slice(text).map(Fields).map_err(|e| {
            if e.is_syntax() || e.is_eof() {
                MlflowError::invalid("body", format!("the body is not valid JSON ({e})"))
            } else {
                MlflowError::invalid("body", wire::plain_serde_message(&e.to_string()))
            }
        })
    }
}
